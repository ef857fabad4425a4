"""On ``--resume``: fetch again the batches run-api served after the checkpoint, so each reaches the weights once.

A trainer that stops between checkpoints (SIGKILL, OOM, a power cut) has taken batches from
run-api that its last checkpoint (step ``S``) does not hold: run-api is at step ``C > S``. Those
groups were acknowledged to their envs and will never be served again by a plain ``GET /batch``.
run-api keeps the batches it served by step (the last one at least; the last K, durable with
``--db``, where it supports that), so the resumed trainer asks for them by number:

1. ``GET /status`` gives ``C`` (run-api's ``current_step``);
2. ``GET /batch?step=N`` for ``N = S+1 .. C``, *before* registering again (an older run-api
   forgets its kept batch when a trainer registers): a batch is kept for its step; ``409`` means
   run-api no longer holds that batch, and its groups are lost (one warning for all of them);
3. ``POST /register`` with ``starting_step = max(S, C)``: run-api's step numbering is left as
   it is (it never goes back to ``S``), so trainer step and run-api step stay equal;
4. the loop trains the kept batches as steps ``S+1 .. C`` (a lost step is a step without an
   update) and then asks plain ``GET /batch`` for ``C+1`` onwards.

An Atropos 0.4 server ignores ``?step=N`` and would serve a new batch instead: resume against
it re-trains nothing but loses what the crashed trainer had taken, as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atroposlib.errors import ApiNotRegisteredError, ApiRejectedError


@dataclass
class Replay:
    """What a resumed trainer takes from run-api before registering again.

    Attributes:
        server_step: run-api's step before the resume (``C``); the trainer registers with
            ``max(checkpoint step, server_step)``.
        batches: step -> the groups of the batch served as that step (``[]``: lost); the loop
            takes them out as it trains them.
        lost: steps whose batches run-api no longer kept.
        replayed: how many batches were fetched again.
    """

    server_step: int = 0
    batches: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    lost: list[int] = field(default_factory=list)
    replayed: int = 0


def fetch_served_batches(client: Any, checkpoint_step: int, run_dir: Path, batch_size: int) -> Replay:
    """Fetch the batches run-api served after ``checkpoint_step`` (call before ``/register``).

    Prints one line for the replayed batches and one warning for the lost ones, naming how
    many sequences (and groups, where the interrupted run logged them) never reach the weights.

    Args:
        client: an :class:`~atroposlib.api.client.AtroposClient`.
        checkpoint_step: the step of the checkpoint the trainer resumed from (``S``).
        run_dir: the run directory (its ``metrics.jsonl`` counts the lost groups).
        batch_size: sequences per batch (each lost batch had this many).

    Returns:
        The :class:`Replay`; empty when run-api is not past ``checkpoint_step``.

    Raises:
        ApiError: run-api unreachable, or refusing with a status other than 409.
    """
    server_step = int(client.status().get("current_step", 0))
    replay = Replay(server_step=server_step)
    for step in range(checkpoint_step + 1, server_step + 1):
        try:
            body = client.request("GET", "/batch", params={"step": step})
        except ApiRejectedError as exc:
            if exc.status_code != 409:
                raise
            body = None
        if isinstance(body, dict) and body.get("status") == "error":
            raise ApiNotRegisteredError(body.get("message", "trainer not registered"))
        batch = body.get("batch") if isinstance(body, dict) else None
        replay.batches[step] = batch or []
        if batch:
            replay.replayed += 1
        else:
            replay.lost.append(step)
    if replay.replayed:
        print(f"[grpo] run-api served {replay.replayed} batch(es) after checkpoint step "
              f"{checkpoint_step} that the checkpoint does not hold: training them again "
              f"(steps {_ranges([s for s in replay.batches if s not in replay.lost])})", flush=True)
    if replay.lost:
        groups = _logged_groups(run_dir, replay.lost)
        known = f", {groups} groups by metrics.jsonl" if groups is not None else ""
        print(f"[grpo] warning: run-api no longer keeps the batches of steps {_ranges(replay.lost)} "
              f"({len(replay.lost)} batch(es): {len(replay.lost) * batch_size} sequences{known}), "
              "served before the trainer stopped: their groups never reach the weights. A run-api "
              "that keeps more served batches (with --db) avoids this", flush=True)
    return replay


def _logged_groups(run_dir: Path, steps: list[int]) -> int | None:
    """Groups the interrupted run logged for ``steps`` in ``metrics.jsonl`` (None: not all logged)."""
    path = Path(run_dir) / "metrics.jsonl"
    last: dict[int, int] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("step") in steps and "groups" in record:
                last[record["step"]] = int(record["groups"]) + int(record.get("skipped_groups", 0))
    return sum(last.values()) if all(s in last for s in steps) else None


def _ranges(steps: list[int]) -> str:
    """``[4, 5, 6, 9]`` -> ``"4..6, 9"``."""
    out: list[str] = []
    for step in sorted(steps):
        if out and out[-1].split("..")[-1] == str(step - 1):
            out[-1] = f"{out[-1].split('..')[0]}..{step}"
        else:
            out.append(str(step))
    return ", ".join(out)
