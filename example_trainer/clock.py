"""The training run's clocks: wall time, the training loop's seconds and the evaluations' seconds.

``--max-train-seconds`` and the learning-rate schedule count :meth:`TrainClock.elapsed`: the
seconds since the trainer registered with run-api, less the evaluations run since then (an
evaluation's time is not training, however often one evaluates). All times are
``time.perf_counter()`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class TrainClock:
    """Where the run's seconds went (see module docstring).

    Attributes:
        wall_start: when the run began (``perf_counter()`` seconds).
        train_start: when it registered with run-api (None before).
        train_seconds: the training loop's length, set by :meth:`end_training` (None before).
        eval_seconds: every evaluation's seconds so far (``summary.json``).
        eval_seconds_at_start: those spent before registration, outside :meth:`elapsed` anyway.
    """

    def __init__(self, wall_start: float | None = None):
        """Start the wall clock at ``wall_start`` (default: now)."""
        self.wall_start = time.perf_counter() if wall_start is None else wall_start
        self.train_start: float | None = None
        self.train_seconds: float | None = None
        self.eval_seconds = 0.0
        self.eval_seconds_at_start = 0.0

    def start_training(self) -> None:
        """The trainer registered: the training clock starts now."""
        self.train_start = time.perf_counter()
        self.eval_seconds_at_start = self.eval_seconds

    @contextmanager
    def evaluation(self) -> Iterator[None]:
        """Count the seconds of the ``with`` block as evaluation (kept off the training budget).

        Only a block that returns counts (an evaluation that raised ends the run anyway).
        """
        begin = time.perf_counter()
        yield
        self.eval_seconds += time.perf_counter() - begin

    def elapsed(self) -> float:
        """Seconds since registration, the evaluations run since then excluded.

        The evaluation of the starting policy runs before registration: it is outside this clock,
        so it is not subtracted (it used to be, which made the budget read low until it caught up).
        """
        return time.perf_counter() - (self.train_start or 0.0) - (self.eval_seconds - self.eval_seconds_at_start)

    def end_training(self) -> float:
        """Fix :attr:`train_seconds` (once; 0 when training never started) and return it."""
        if self.train_seconds is None:
            self.train_seconds = 0.0 if self.train_start is None else time.perf_counter() - self.train_start
        return self.train_seconds

    def wall_seconds(self) -> float:
        """Seconds since the run began."""
        return time.perf_counter() - self.wall_start


__all__ = ["TrainClock"]
