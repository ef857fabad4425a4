"""What the console says about a run's progress: ``step N/M``, the budget used, the ETA, what it waits for.

Pure functions of numbers the loop has; :class:`~example_trainer.report.RunLog` prints them at
the head of each step line, :func:`~example_trainer.grpo.wait_for_batch` while it waits::

    [grpo] step 12/~58 (budget 3m05s/14m00s, 22%, ETA 11m): reward/mean=0.375 loss=0.01 ...
    [grpo] waiting for the first batch (16 sequences): run-api has 1 group queued, 10s so far
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def step_ranges(steps: Iterable[int]) -> str:
    """Steps as runs: ``[4, 5, 6, 9]`` -> ``"4..6, 9"`` (``"none"`` when empty)."""
    out: list[str] = []
    for step in sorted(steps):
        if out and out[-1].split("..")[-1] == str(step - 1):
            out[-1] = f"{out[-1].split('..')[0]}..{step}"
        else:
            out.append(str(step))
    return ", ".join(out) or "none"


def duration(seconds: float | None) -> str:
    """``seconds`` for a person: ``45s``, ``3m05s``, ``1h02m``; ``?`` for None or not finite."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress_text(step: int, training_steps: int, elapsed: float, budget: float | None = None,
                  start_step: int = 0) -> str:
    """The head of a step's console line: ``step N/M``, the training time or budget used, an ETA.

    The rate is this run's seconds per step so far (``elapsed / (step - start_step)``). With a
    time budget that ends the run before ``training_steps``, ``M`` is the step the budget is
    expected to end at, marked ``~``, and the ETA is the budget left.

    Args:
        step: the step just taken (1-based).
        training_steps: ``--training-steps``, the last step.
        elapsed: seconds of training so far (what ``--max-train-seconds`` counts: evaluations
            excluded).
        budget: ``--max-train-seconds`` (None or 0: no budget).
        start_step: the step this run started after (a resumed run's checkpoint).

    Returns:
        E.g. ``step 12/400 (3m05s, ETA 1h39m)`` or ``step 12/~58 (budget 3m05s/14m00s, 22%,
        ETA 11m51s)``.
    """
    done = step - start_step
    rate = elapsed / done if done > 0 and elapsed > 0 else None
    steps_left = max(training_steps - step, 0)
    eta = steps_left * rate if rate is not None else None if steps_left else 0.0
    total = str(training_steps)
    if budget:
        left = max(budget - elapsed, 0.0)
        if rate is not None and left / rate < steps_left:  # the budget ends the run first
            total = f"~{step + int(left // rate)}"
            eta = left
        used = f"budget {duration(elapsed)}/{duration(budget)}, {min(elapsed / budget, 1.0):.0%}"
    else:
        used = duration(elapsed)
    return f"step {step}/{total} ({used}, ETA {duration(eta)})"


def waiting_text(status: dict[str, Any] | None, waited: float, first: bool,
                 batch_size: int | None = None) -> str:
    """What the trainer waits for while no batch comes, from run-api's ``GET /status``.

    Args:
        status: the ``/status`` answer (``queue_size`` in groups), or None when it failed.
        waited: seconds spent waiting for this batch.
        first: whether no batch arrived yet in this run.
        batch_size: sequences per batch, when known.

    Returns:
        E.g. ``waiting for the first batch (16 sequences): run-api has 0 groups queued, 10s so
        far; the environments send groups once they are up``.
    """
    what = "the first batch" if first else "the next batch"
    if batch_size:
        what += f" ({batch_size} sequences)"
    if status is None or not isinstance(status.get("queue_size"), int):
        queued = "run-api did not answer GET /status"
    else:
        n = status["queue_size"]
        queued = f"run-api has {n} group{'' if n == 1 else 's'} queued"
    hint = "; the environments send groups once they are up" if first else ""
    return f"waiting for {what}: {queued}, {duration(waited)} so far{hint}"
