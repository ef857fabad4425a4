"""Serve mode's rollout scheduling: how many rollouts may be in flight, and when to pause.

Pure functions for the staleness window (:func:`offpolicy_window`, :func:`offpolicy_room`,
:func:`inflight_cap`), the automatic rollout cap (:func:`demand_cap`) and
:class:`RolloutPacer`, the backoff policy that reacts to each rollout's outcome (inference
outages, failing rollouts, groups dropped for a configuration problem).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, NamedTuple

from atroposlib.env_runtime.step import REFUSAL_STREAK, Skip, refusal_message
from atroposlib.envs.run_state import batch_share
from atroposlib.inference.clients.base import is_refused_request

logger = logging.getLogger(__name__)

#: Drops that repeat for every item while the env or trainer config is wrong (serve backs off
#: after a run of them); equal-score drops are normal and are not among them.
CONFIG_REJECTS = frozenset({Skip.TOO_LONG, Skip.INVALID, Skip.WRONG_SIZE})


class OffpolicyWindow(NamedTuple):
    """The staleness window in force (:func:`offpolicy_window`).

    Attributes:
        batches: the window in trainer batches (>= 1), or None when nothing limits it.
        lag: trainer steps taken while one rollout runs, ``ceil(latency / step_interval)``
            (0 while either is unknown).
        bound: ``max_staleness - lag`` before clamping to 1 batch (None without a limit).
    """

    batches: int | None
    lag: int
    bound: int | None

    @property
    def too_small(self) -> bool:
        """True when the staleness bound left less than one batch: some groups may go stale."""
        return self.bound is not None and self.bound < 1


def offpolicy_window(
    max_batches_offpolicy: int,
    max_staleness: int | None,
    latency: float | None = None,
    step_interval: float | None = None,
) -> OffpolicyWindow:
    """How many batches ahead of the trainer an env may sample, given run-api's staleness limit.

    run-api drops a group at ``GET /batch`` when ``step - policy_version > max_staleness``,
    and a group's policy version is the step its rollout started at. A group is consumed at
    about ``start_step + latency / step_interval + batches queued ahead of it`` (the trainer
    keeps stepping while the rollout runs, then serves the queue FIFO), so it stays fresh
    while the batches ahead of it stay below ``max_staleness - latency / step_interval``::

        lag    = ceil(latency / step_interval)          (0 while either is unknown)
        window = min(max_batches_offpolicy, max_staleness - lag),   at least 1 batch

    The window counts the queue, the unsent groups and the rollouts in flight
    (:func:`offpolicy_room`), so a group arrives with fewer than ``window`` batches ahead of
    it and is served at most ``lag + window - 1`` steps after its rollout started: one step
    inside the limit, which covers the age of the step an env stamps (it reads the step from
    ``/status-env`` polls). The bound is tight for a rollout that others overtake; when
    rollouts take equally long it is conservative, since by Little's law (in flight = arrival
    rate x latency) a fed trainer keeps about ``lag`` of the window's batches in flight.

    Below one batch no window keeps every group fresh: a rollout takes about
    ``max_staleness`` steps or more. The window stays at one batch, so the trainer waits for
    each batch, its steps slow down and the groups arrive in time (at a cost in throughput);
    serve mode warns once (:attr:`OffpolicyWindow.too_small`).

    Args:
        max_batches_offpolicy: the env's own window in batches; <= 0: none (the staleness
            limit alone, if any, bounds it).
        max_staleness: run-api's limit in force (``/status-env``), in policy versions (steps);
            None: no limit, the env's window as it is.
        latency: smoothed seconds from a rollout's start to its finished group, or None.
        step_interval: smoothed seconds between trainer steps, or None.

    Returns:
        The window, with the lag and the unclamped bound.
    """
    own = max_batches_offpolicy if max_batches_offpolicy > 0 else None
    if max_staleness is None:
        return OffpolicyWindow(own, 0, None)
    lag = 0
    if latency is not None and step_interval is not None and step_interval > 0:
        lag = math.ceil(latency / step_interval)
    bound = max_staleness - lag
    window = bound if own is None else min(own, bound)
    return OffpolicyWindow(max(1, window), lag, bound)


def offpolicy_room(
    status: dict[str, Any],
    batch_size: int,
    group_size: int,
    max_batches_offpolicy: int,
    min_batch_allocation: float | None,
    unsent_groups: int = 0,
) -> int | None:
    """How many more groups this env may have in flight without exceeding the staleness window.

    ``room = max_batches_offpolicy * derived_batch_size // group_size - queue_size - unsent``,
    raised to the env's minimum-allocation floor when ``min_batch_allocation`` is set.

    Args:
        status: the ``/status-env`` response.
        batch_size: trainer batch size in sequences (> 0).
        group_size: this env's group size.
        max_batches_offpolicy: staleness window in batches (serve mode passes
            :func:`offpolicy_window`'s); <= 0 disables the limit.
        min_batch_allocation: this env's reserved fraction of each batch, or None.
        unsent_groups: finished groups the status does not count yet (local outbox, and
            groups sent since the status was read).

    Returns:
        The room in groups (may be <= 0), or None when there is no limit.
    """
    if max_batches_offpolicy <= 0 or batch_size <= 0:
        return None
    derived = batch_share(batch_size, status, min_batch_allocation)
    room = max_batches_offpolicy * derived // group_size - int(status.get("queue_size", 0)) - unsent_groups
    if min_batch_allocation is not None:
        m = max(1, int(status.get("max_group_size", group_size)))
        s = int(status.get("self_queue_size", 0))
        floor = max(
            0,
            math.ceil(
                (
                    (math.ceil(min_batch_allocation * batch_size * max_batches_offpolicy / m) + m // group_size) * m
                    - math.floor(m * s / (m / group_size))
                )
                / group_size
            ),
        )
        room = max(room, floor - unsent_groups)
    return room


def total_steps_reached(step: int, total_steps: int, status: dict[str, Any], group_size: int,
                        batch_size: int) -> bool:
    """True when the groups run-api holds already carry the trainer to ``total_steps``.

    ``step + queue_size * group_size // batch_size >= total_steps`` (``queue_size`` from the
    ``/status-env`` answer ``status``); always False with ``total_steps <= 0`` or no status.
    """
    if total_steps <= 0 or not status:
        return False
    ahead = int(status.get("queue_size", 0)) * group_size // batch_size if batch_size > 0 else 0
    return step + ahead >= total_steps


def spawn_backoff(n: int) -> float:
    """Pause before the next spawn after the ``n``-th (from 0) repeated failure: 0.1 s doubling to 10 s."""
    return min(10.0, 0.1 * 2 ** min(n, 7))


YIELD_WINDOW = 32
"""Finished rollouts that :func:`inflight_cap`'s yield estimate looks back on."""


def inflight_cap(room: int, recent_yields: Sequence[int], min_yield: float = 0.125) -> int:
    """Rollouts that may be in flight when ``room`` more groups fit the staleness window.

    A rollout in flight does not always become a group: with ``ensure_scores_are_not_same``
    (DAPO's dynamic sampling, Yu et al. 2025, arXiv:2503.14476, section 3.2) groups whose
    scores are all equal are dropped, often most of them once a policy is good. Counting each
    rollout in flight as a whole group then starves the trainer: with 2 batches of room and 70%
    dropped, barely one useful group is sampled at a time. So each rollout counts as the mean
    number of usable groups that the recent rollouts yielded, and the expected number of groups
    stays within the window::

        cap = floor(room / max(mean(recent_yields), min_yield))     (room if no yield is known)

    Args:
        room: groups that still fit the window (:func:`offpolicy_room`); <= 0 gives 0.
        recent_yields: usable groups per recently finished rollout (newest last); rollouts
            whose inference failed are not in it.
        min_yield: the smallest yield assumed (bounds the cap at ``room / min_yield``).

    Returns:
        The most rollouts to keep in flight (``max_num_workers`` still bounds it).
    """
    if room <= 0:
        return 0
    if not recent_yields:
        return room
    expected = max(sum(recent_yields) / len(recent_yields), min_yield)
    return max(room, math.floor(room / expected))


DEMAND_HEADROOM = 1.5
"""How far above the estimated need :func:`demand_cap` sets the automatic rollout cap."""


def demand_cap(
    groups_per_step: int,
    latency: float | None,
    step_interval: float | None,
    recent_yields: Sequence[int],
    headroom: float = DEMAND_HEADROOM,
    min_yield: float = 0.125,
) -> int | None:
    """Rollouts in flight that keep the trainer fed: the automatic ``max_num_workers``'s demand.

    Little's law (Little 1961, "A proof for the queuing formula L = lambda W"): the rollouts
    in flight equal the rate at which they start times how long each runs. The trainer takes
    ``groups_per_step`` groups every ``step_interval`` seconds and a rollout gives
    ``mean(recent_yields)`` usable groups, so::

        need = groups_per_step / mean_yield * latency / step_interval
        cap  = ceil(headroom * need)

    The step interval is measured, so while the trainer waits for data it is the env's own
    pace and ``need`` equals what is in flight now: the headroom makes the cap grow until the
    trainer is fed (or the staleness window binds, which serve mode applies on top).

    Args:
        groups_per_step: groups of this env a trainer batch takes (its share of the batch
            divided by its group size, >= 1).
        latency: smoothed seconds from a rollout's start to its finished group, or None.
        step_interval: smoothed seconds between trainer steps, or None.
        recent_yields: usable groups per recently finished rollout (1 assumed when empty).
        headroom: factor above the need (> 1 lets a starved trainer's supply grow).
        min_yield: the smallest yield assumed.

    Returns:
        The cap in rollouts (>= 1), or None while the latency or step interval is unknown.
    """
    if latency is None or step_interval is None or step_interval <= 0:
        return None
    mean_yield = sum(recent_yields) / len(recent_yields) if recent_yields else 1.0
    need = max(1, groups_per_step) / max(mean_yield, min_yield) * latency / step_interval
    return max(1, math.ceil(headroom * need))


class RolloutPacer:
    """When the next rollout may start: backoff after inference outages, errors and config drops.

    Serve's reaction to each rollout's :class:`~atroposlib.env_runtime.step.Outcome`
    (:meth:`note`): an inference outage pauses new rollouts with doubling backoff (up to
    ``inference_backoff_max`` s); while every rollout raises, spawning pauses 0.1 s, 0.2 s, ...
    up to 10 s (:func:`spawn_backoff`); so it does, from the ``reject_streak``-th in a row, while
    every rollout's groups are dropped as too long, invalid or of the wrong size. A usable group
    resets all three; equal-score drops neither slow nor reset, and neither do rollouts past
    ``rollout_timeout`` (``Skip.TIMEOUT``): a slow server is not an outage, and pausing every
    rollout whenever a loaded server makes the groups in flight time out together stalls
    sampling.
    """

    def __init__(self, env: Any, state: Any, inference_backoff_max: float, reject_streak: int):
        """Set up the pacer (no pause yet).

        Args:
            env: the env (its ``config`` and ``stats``).
            state: its :class:`~atroposlib.envs.run_state.RunState` (``max_seq_len``).
            inference_backoff_max: the longest pause (s) after an inference outage.
            reject_streak: config drops in a row after which spawning backs off.
        """
        self.env = env
        self.config = env.config
        self.state = state
        self.inference_backoff_max = inference_backoff_max
        self.reject_streak = reject_streak
        self.inference_pause_until = 0.0
        self.inference_backoff = 1.0
        self.consecutive_errors = 0
        self.consecutive_rejects = 0
        self.reject_reasons: Counter[Skip] = Counter()  # reasons within the current streak

    def paused(self) -> bool:
        """True while new rollouts must wait."""
        return time.monotonic() < self.inference_pause_until

    def note(self, outcome: Any) -> None:
        """Update the pauses from one rollout's outcome (see the class docstring)."""
        if outcome.reason is Skip.INFERENCE:
            delay = self.inference_backoff
            self.inference_backoff = min(self.inference_backoff * 2, self.inference_backoff_max)
            self.inference_pause_until = time.monotonic() + delay
            logger.warning("item re-queued, pausing new rollouts %.1f s", delay)
        elif outcome.reason is Skip.ERROR:
            self.consecutive_errors += 1
            # 0.1 s, 0.2 s, ... up to 10 s between spawns instead of spinning; reset by a success.
            delay = spawn_backoff(self.consecutive_errors - 1)
            self.inference_pause_until = max(self.inference_pause_until, time.monotonic() + delay)
            refused = outcome.error is not None and is_refused_request(outcome.error)
            if refused and self.consecutive_errors == REFUSAL_STREAK:
                logger.warning("%s", refusal_message(self.consecutive_errors, outcome.error))
            elif self.consecutive_errors > 1:
                logger.warning("%d rollout failures in a row", self.consecutive_errors)
        elif outcome.reason is Skip.TIMEOUT:
            pass  # a slow group: dropped and counted (groups_dropped_timeout), no pause
        elif outcome.reason in CONFIG_REJECTS:
            self.inference_backoff = 1.0
            self.consecutive_errors = 0
            self._note_rejects(outcome)
        elif outcome.reason is None:
            self.inference_backoff = 1.0
            self.consecutive_errors = 0
            self.consecutive_rejects = 0
            self.reject_reasons.clear()
        else:  # same scores / the env skipped the item: normal, neither slows nor resets
            self.inference_backoff = 1.0
            self.consecutive_errors = 0

    def _note_rejects(self, outcome: Any) -> None:
        """Count a rollout whose groups were all dropped as too_long / invalid / wrong_size.

        Such drops repeat for every item while the config is wrong (a trainer ``max_token_len``
        below the env's ``max_token_length``, an env that returns the wrong number of
        sequences), and respawning at once burns CPU for nothing. From the ``reject_streak``-th
        in a row, spawning pauses 0.1 s, 0.2 s, ... up to 10 s (like errors), and one warning
        per streak names the cause and the fix. Equal-score drops do not count.
        """
        self.consecutive_rejects += 1
        self.reject_reasons[outcome.reason] += 1
        beyond = self.consecutive_rejects - self.reject_streak
        if beyond < 0:
            return
        delay = spawn_backoff(beyond)
        self.inference_pause_until = max(self.inference_pause_until, time.monotonic() + delay)
        self.env.stats["reject_backoffs"] += 1
        if beyond == 0:
            logger.warning("%s", self._reject_advice(outcome))

    def _reject_advice(self, outcome: Any) -> str:
        counts = ", ".join(f"{n} {reason.value}" for reason, n in self.reject_reasons.most_common())
        example = outcome.dropped[0][1] if outcome.dropped else str(outcome.reason)
        head = (
            f"the last {self.consecutive_rejects} rollouts all had their groups dropped "
            f"({counts}; e.g. {example}); pausing new rollouts (up to 10 s) until one succeeds. "
        )
        main = self.reject_reasons.most_common(1)[0][0]
        if main is Skip.TOO_LONG:
            return head + (
                f"Sequences reach the trainer's max_token_len ({self.state.max_seq_len}) while "
                f"the env generates up to max_token_length={self.config.max_seq_len}: raise "
                "the trainer's max_token_len, or lower the env's --env.max_token_length (and the "
                "max_tokens it asks the server for)."
            )
        if main is Skip.WRONG_SIZE:
            return head + (
                f"Groups must have --env.group_size={self.config.group_size} sequences: return "
                "that many from collect_trajectories, or set group_overrides['group_size'] for "
                "variable-size groups."
            )
        return head + (
            "Groups must carry tokens, masks and scores with one row per sequence and matching "
            "row lengths: fix what collect_trajectories / score returns (check_env shows it)."
        )


__all__ = ["CONFIG_REJECTS", "DEMAND_HEADROOM", "YIELD_WINDOW", "OffpolicyWindow", "RolloutPacer",
           "demand_cap", "inflight_cap", "offpolicy_room", "offpolicy_window", "spawn_backoff",
           "total_steps_reached"]
