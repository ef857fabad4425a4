"""Serve mode's pace: the trainer's step interval, this env's rollout latency, and the rollouts they allow.

:class:`PaceTracker` keeps exponentially smoothed estimates of both intervals, from what the
serve loop sees: the trainer step in each ``/status-env`` answer, and how long each rollout
ran. :class:`RolloutBudget` turns them, with the recent yield of usable groups and the last
``/status-env`` answer, into the number of rollouts the loop may keep in flight: the staleness
window (:func:`~atroposlib.env_runtime.scheduling.offpolicy_window`), the automatic cap
(:func:`~atroposlib.env_runtime.scheduling.demand_cap`) and the room left in the window
(:func:`~atroposlib.env_runtime.scheduling.offpolicy_room`,
:func:`~atroposlib.env_runtime.scheduling.inflight_cap`).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from atroposlib.env_runtime.scheduling import (
    YIELD_WINDOW,
    OffpolicyWindow,
    demand_cap,
    inflight_cap,
    offpolicy_room,
    offpolicy_window,
)
from atroposlib.envs.run_state import batch_share

logger = logging.getLogger(__name__)

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



class RolloutBudget:
    """How many rollouts the serve loop may keep in flight, from the trainer's pace.

    Args:
        env: the env served (its ``config`` and ``max_num_workers``, the per-server default).
        state: the loop's :class:`~atroposlib.envs.run_state.RunState` (``batch_size``).

    Attributes:
        pace: the :class:`PaceTracker` (the loop feeds it the trainer's steps).
        recent_yields: usable groups per recently finished rollout (newest last).
    """

    def __init__(self, env: Any, state: Any):
        self.env, self.config, self.state = env, env.config, state
        self.pace = PaceTracker()
        self.recent_yields: deque[int] = deque(maxlen=YIELD_WINDOW)
        self.window_warned = False

    def note_rollout(self, groups: int, seconds: float) -> None:
        """Record a rollout whose inference answered: ``groups`` usable groups after ``seconds``."""
        self.recent_yields.append(groups)
        self.pace.note_rollout(seconds)

    def window(self, status: dict[str, Any]) -> OffpolicyWindow:
        """The off-policy window now: ``max_batches_offpolicy`` narrowed to the staleness limit.

        :func:`offpolicy_window` with the ``max_staleness`` of the ``/status-env`` answer
        ``status`` (none before one) and the measured latency and step interval;
        ``max_batches_offpolicy`` as set with ``follow_trainer_pace=false``. When the
        limit leaves less than one batch, logs one warning (per run) with the numbers and what
        to change.
        """
        if not status:
            return OffpolicyWindow(None, 0, None)
        if not self.config.follow_trainer_pace:  # the window as set, whatever the pace
            fixed = self.config.max_batches_offpolicy
            return OffpolicyWindow(fixed if fixed > 0 else None, 0, None)
        limit = status.get("max_staleness")
        window = offpolicy_window(self.config.max_batches_offpolicy,
                                  None if limit is None else int(limit),
                                  self.pace.latency, self.pace.step_interval)
        if window.too_small and not self.window_warned:
            self.window_warned = True
            logger.warning(
                "max_staleness=%s leaves less than one batch to sample ahead: a rollout takes "
                "~%s s and the trainer steps every ~%s s, so ~%d step(s) pass while it runs. "
                "Sampling one batch ahead; some groups may still be dropped as stale. Raise the "
                "trainer's max_staleness to at least %d (atropos-grpo --max-staleness, or "
                "run-api --max-staleness), or shorten rollouts (max_tokens, group_size).",
                limit, seconds_text(self.pace.latency), seconds_text(self.pace.step_interval),
                window.lag, window.lag + 1)
        return window

    def groups_per_step(self, status: dict[str, Any]) -> int:
        """Groups of this env a trainer batch takes (its share of the batch / group_size, >= 1)."""
        share = batch_share(self.state.batch_size, status, self.config.min_batch_allocation)
        return max(1, share // self.config.group_size)

    def cap(self, status: dict[str, Any], unsent_groups: int, scale: float | None = None) -> int:
        """Rollouts allowed in flight now.

        Starts from ``env.max_num_workers``; with ``max_num_workers=-1`` (automatic) and a
        window in force, the larger of that per-server default and :func:`demand_cap` (the
        window, not the cap, then bounds staleness; a ``max_num_workers`` the user set is a
        hard cap). ``scale`` (an evaluation running under ``LIMIT_TRAIN``) multiplies it. Then
        at most what the room left in the window allows, each rollout counted as the groups
        recent rollouts yielded (:func:`inflight_cap`).

        Args:
            status: the last ``/status-env`` answer (empty before one).
            unsent_groups: finished groups the status does not count yet.
            scale: a factor in [0, 1] applied before the window's bound, or None.
        """
        cap = self.env.max_num_workers
        window = self.window(status)
        automatic = self.config.max_num_workers <= 0 and self.config.follow_trainer_pace
        if window.batches is not None and automatic and self.state.batch_size > 0:
            demand = demand_cap(self.groups_per_step(status), self.pace.latency,
                                self.pace.step_interval, self.recent_yields)
            if demand is not None:
                cap = max(cap, demand)
        if scale is not None:
            cap = int(cap * scale)
        if window.batches is not None:
            room = offpolicy_room(status, self.state.batch_size, self.config.group_size,
                                  window.batches, self.config.min_batch_allocation,
                                  unsent_groups=unsent_groups)
            if room is not None:  # rollouts count by how many groups they recently yielded
                cap = min(cap, inflight_cap(room, self.recent_yields))
        return cap

    def report(self, status: dict[str, Any]) -> dict[str, float]:
        """The adaptation's numbers now (unknown ones left out).

        Keys: ``offpolicy_window_batches``, ``rollout_latency_s`` (smoothed, start to finished
        group), ``step_interval_s`` (smoothed seconds per trainer step).
        """
        out: dict[str, float] = {}
        window = self.window(status)
        if window.batches is not None:
            out["offpolicy_window_batches"] = float(window.batches)
        if self.pace.latency is not None:
            out["rollout_latency_s"] = self.pace.latency
        if self.pace.step_interval is not None:
            out["step_interval_s"] = self.pace.step_interval
        return out


def seconds_text(seconds: float | None) -> str:
    """``seconds`` for a log line: one decimal, ``?`` while unknown."""
    return "?" if seconds is None else f"{seconds:.1f}"


__all__ = ["SMOOTHING", "PaceTracker", "RolloutBudget", "seconds_text", "smooth"]
