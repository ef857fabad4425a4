"""On ``--resume``: the batches run-api served after the checkpoint reach the weights once.

A trainer that stops between checkpoints (SIGKILL, OOM, a power cut) has taken batches from
run-api that its last checkpoint (step ``S``) does not hold: run-api is at step ``C > S``. Those
groups were acknowledged to their envs and will never be served again by a plain ``GET /batch``.
run-api keeps the batches it served by step (the last K, durable with ``--db``), and the
client re-fetches them (one mechanism, owned by :class:`~atroposlib.api.client.AtroposClient`):

1. ``POST /register`` with ``starting_step = S``: run-api sees a resume, keeps its step ``C``
   and answers which of the served batches it still keeps;
2. the client's next ``get_batch()`` calls ask ``GET /batch?step=N`` for the kept steps up to
   ``C``, then go on with plain ``GET /batch``;
3. the trainer numbers its steps like run-api: a step whose batch run-api no longer keeps is a
   step without an update (one warning for all of them), so trainer step and run-api step stay
   equal.

This module prints what the resume takes again and what it lost. An Atropos 0.4 server ignores
``?step=N`` and would serve a new batch instead: resume against it re-trains nothing but loses
what the crashed trainer had taken, as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atroposlib.api.client import ResumedSteps
from example_trainer.progress import step_ranges


@dataclass
class Replay:
    """What a resumed trainer takes from run-api again.

    Attributes:
        server_step: run-api's step at the resume (``C``).
        batches: lost step -> ``[]`` (trained as a step without an update); the loop takes them
            out as it reaches them.
        lost: steps whose batches run-api no longer kept.
        replayed: how many batches are fetched again.
    """

    server_step: int = 0
    batches: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    lost: list[int] = field(default_factory=list)
    replayed: int = 0


def announce(resumed: ResumedSteps | None, checkpoint_step: int, run_dir: Path, batch_size: int) -> Replay:
    """What a resumed trainer takes from run-api again, from its client's registration; printed.

    Prints one line for the batches fetched again and one warning for the lost ones, naming how
    many sequences (and groups, where the interrupted run logged them) never reach the weights.

    Args:
        resumed: :attr:`AtroposClient.resumed <atroposlib.api.client.AtroposClient.resumed>`
            after ``register()`` (None: nothing to resume).
        checkpoint_step: the step of the checkpoint the trainer resumed from (``S``).
        run_dir: the run directory (its ``metrics.jsonl`` counts the lost groups).
        batch_size: sequences per batch (each lost batch had this many).

    Returns:
        The :class:`Replay`: ``batches`` maps each lost step to ``[]`` (a step without an
        update); the refetched ones come from ``get_batch()``.
    """
    if resumed is None:
        return Replay()
    replay = Replay(server_step=resumed.server_step, batches={s: [] for s in resumed.lost},
                    lost=list(resumed.lost), replayed=len(resumed.refetched))
    if resumed.refetched:
        print(f"[grpo] run-api served {len(resumed.refetched)} batch(es) after checkpoint step "
              f"{checkpoint_step} that the checkpoint does not hold: training them again "
              f"(steps {step_ranges(resumed.refetched)})", flush=True)
    if replay.lost:
        groups = _logged_groups(run_dir, replay.lost)
        known = f", {groups} groups by metrics.jsonl" if groups is not None else ""
        print(f"[grpo] warning: run-api no longer keeps the batches of steps {step_ranges(replay.lost)} "
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
