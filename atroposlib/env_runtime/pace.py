"""Serve mode's view of the loop's pace: the trainer's step interval and this env's rollout latency.

:class:`PaceTracker` keeps exponentially smoothed estimates of both, from what the serve loop
sees: the trainer step in each ``/status-env`` answer, and how long each rollout ran. The
staleness window (:func:`~atroposlib.env_runtime.scheduling.offpolicy_window`) and the
automatic rollout cap (:func:`~atroposlib.env_runtime.scheduling.demand_cap`) read them.
"""

from __future__ import annotations

SMOOTHING = 0.2
"""Weight of the newest sample in the exponential moving averages (0 < a <= 1)."""


def smooth(previous: float | None, sample: float, weight: float = SMOOTHING) -> float:
    """Moving average ``previous + weight * (sample - previous)``; ``sample`` at first."""
    return sample if previous is None else previous + weight * (sample - previous)


class PaceTracker:
    """Smoothed trainer step interval and rollout latency, in seconds (None until measured).

    * Step interval: on each step change seen, the seconds since the previous change divided
      by the steps it moved (a poll may see several). The first change only starts the clock:
      the time before it includes the trainer's start-up and the first batch's sampling. A
      step that goes backwards (a trainer restarted from a checkpoint) restarts it too.
    * Latency: seconds from a rollout's start to its finished groups, for every rollout whose
      inference answered (outages are retried and would skew it).
    """

    def __init__(self, weight: float = SMOOTHING):
        """No estimates yet.

        Args:
            weight: the newest sample's weight in the moving averages (0 < weight <= 1).

        Raises:
            ValueError: ``weight`` is outside (0, 1].
        """
        if not 0 < weight <= 1:
            raise ValueError(f"smoothing weight must be in (0, 1], got {weight}")
        self.weight = weight
        self.step_interval: float | None = None
        self.latency: float | None = None
        self._step: int | None = None
        self._changed_at: float | None = None  # when the step last changed (None: not seen yet)

    def note_step(self, step: int, now: float) -> None:
        """Record the trainer step read at monotonic time ``now`` (s); the same step is ignored."""
        if self._step is None:
            self._step = step
            return
        moved = step - self._step
        if moved == 0:
            return
        self._step = step
        if moved > 0 and self._changed_at is not None and now > self._changed_at:
            interval = (now - self._changed_at) / moved
            self.step_interval = smooth(self.step_interval, interval, self.weight)
        self._changed_at = now

    def note_rollout(self, seconds: float) -> None:
        """Record one finished rollout that ran ``seconds`` (>= 0)."""
        self.latency = smooth(self.latency, max(0.0, seconds), self.weight)


__all__ = ["SMOOTHING", "PaceTracker", "smooth"]
