"""``run_item``: the one runner step, "collect a group for an item, post-process it, classify".

Every runner (serve, process, ``check_env``) calls it and reacts to the :class:`Outcome` in its
own way (serve re-queues an item whose inference failed; process counts failures in a row;
``check_env`` turns errors into assertion failures).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from atroposlib.envs.groups import check_groups
from atroposlib.errors import InferenceError, RolloutError, RolloutTimeoutError
from atroposlib.inference.clients.base import http_status, is_transient_error

if TYPE_CHECKING:
    from atroposlib.envs.base import BaseEnv
    from atroposlib.envs.groups import ScoredDataGroup

logger = logging.getLogger(__name__)

#: Items in a row whose request the inference server refused (HTTP 4xx, not 408/409/429) after
#: which ``process`` stops (and serve warns once): the same request will be refused for every item.
REFUSAL_STREAK = 3


class Skip(StrEnum):
    """Why an item gave no usable group (``Outcome.reason``); the value is the stats key suffix."""

    RETURNED_NONE = "none"  #: the env returned None (its own choice to skip the item)
    ERROR = "error"  #: the env raised (a bug or a bad rollout); the group is dropped
    INFERENCE = "inference"  #: inference was unreachable / failed transiently; retry the item
    TIMEOUT = "timeout"  #: a rollout ran past rollout_timeout; the group is dropped, no outage
    INVALID = "invalid"  #: a group lacks tokens/masks/scores or has ragged rows
    WRONG_SIZE = "wrong_size"  #: a group does not have group_size sequences
    SAME_SCORES = "same_scores"  #: all scores equal (no learning signal)
    TOO_LONG = "too_long"  #: a sequence reaches the trainer's max_seq_len


@dataclass
class Outcome:
    """What ``run_item`` made of one item.

    Attributes:
        groups: usable groups, after ``postprocess_histories`` and the checks (unless
            ``validate=False``); a checked list is a
            :class:`~atroposlib.envs.groups.CheckedGroups`, which ``handle_send_to_api`` does
            not check again. Empty when there is none.
        backlog: items the env asked to roll out later.
        reason: None when ``groups`` is non-empty, else why not (:class:`Skip`).
        error: the exception behind ``Skip.ERROR`` / ``Skip.INFERENCE`` / ``Skip.TIMEOUT``.
        dropped: ``(reason, message)`` for each group the checks dropped.
        duration: seconds spent in the env's hooks.
        scores: the scores of every group the env returned, before the checks (what the
            item filter learns from).
    """

    groups: list[ScoredDataGroup] = field(default_factory=list)
    backlog: list[Any] = field(default_factory=list)
    reason: Skip | None = None
    error: BaseException | None = None
    dropped: list[tuple[Skip, str]] = field(default_factory=list)
    duration: float = 0.0
    scores: list[list[float]] = field(default_factory=list)

    @property
    def group(self) -> ScoredDataGroup | None:
        """The first usable group, or None."""
        return self.groups[0] if self.groups else None


def refusal_message(count: int, error: BaseException) -> str:
    """What ``process`` stops with (and serve warns) when the inference server refuses every request."""
    return (
        f"the inference server refused the request of {count} items in a row with HTTP "
        f"{http_status(error)}: {error}. Resending it will not help: fix the request or the "
        "server (a wrong --openai.model_name, image or audio parts sent to a text-only model, "
        "max_tokens beyond the model's context window), then run again"
    )


def classify(exc: BaseException) -> Skip:
    """The :class:`Skip` of an item whose rollout raised ``exc``.

    ``RolloutTimeoutError`` (our ``rollout_timeout`` expired: the server is slow, not down) ->
    ``TIMEOUT``, checked first because it is also a ``TimeoutError``, which
    :func:`~atroposlib.inference.clients.base.is_transient_error` counts as transient;
    ``InferenceError`` or a transient error (connection refused, 5xx, the client's own
    timeout, every server unhealthy) -> ``INFERENCE``; anything else -> ``ERROR``.
    """
    if isinstance(exc, RolloutTimeoutError):
        return Skip.TIMEOUT
    if isinstance(exc, InferenceError) or is_transient_error(exc):
        return Skip.INFERENCE
    return Skip.ERROR


def _stat_key(reason: Skip) -> str:
    return "rollouts_failed_inference" if reason is Skip.INFERENCE else f"groups_dropped_{reason.value}"


async def run_item(
    env: BaseEnv, item: Any, *, validate: bool = True, check_length: bool = True
) -> Outcome:
    """Collect, post-process and check the group(s) of one item; never raises for env errors.

    Calls ``env.collect_trajectories(item)`` then ``env.postprocess_histories``. An exception
    is classified (:func:`classify`): a rollout past ``rollout_timeout``
    (:class:`~atroposlib.errors.RolloutTimeoutError`) -> ``Skip.TIMEOUT``; ``InferenceError`` or
    a transient network/server error (the client's own timeouts included) -> ``Skip.INFERENCE``;
    anything else -> ``Skip.ERROR``; all are logged. Each group is checked, once on the whole
    serve path, with :func:`atroposlib.envs.groups.check_groups` (against ``config.group_size``,
    ``ensure_scores_are_not_same`` and, when ``check_length``, the trainer's ``max_seq_len``).
    Every skip is counted in ``env.stats`` (``groups_dropped_<reason>``,
    ``rollouts_failed_inference``); the rollout duration goes to ``task_durations``.

    Args:
        env: the environment.
        item: the item from ``get_next_item`` (or the backlog).
        validate: run the group checks (``check_env`` runs its own stricter ones instead).
        check_length: drop groups with a sequence of ``>= max_seq_len`` tokens (the trainer's).

    Raises:
        asyncio.CancelledError: the task was cancelled (e.g. a worker timeout).
    """
    start = time.perf_counter()
    outcome = Outcome()
    try:
        result = await env.collect_trajectories(item)
        if not isinstance(result, tuple) or len(result) != 2:
            raise RolloutError(
                f"{type(env).__name__}.collect_trajectories must return (group | list | None, "
                f"backlog_items), got {type(result).__name__}"
            )
        scored, backlog = result
        if backlog is not None and not isinstance(backlog, list):
            raise RolloutError(f"backlog must be a list of items, got {type(backlog).__name__}")
        outcome.backlog = list(backlog or [])
        if scored is not None:
            scored = await env.postprocess_histories(scored)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - classify: infrastructure vs bad rollout
        outcome.error = exc
        outcome.reason = classify(exc)
        env.stats[_stat_key(outcome.reason)] += 1
        logger.warning(
            "%s (%s: %s)",
            "inference failed" if outcome.reason is Skip.INFERENCE else "rollout failed, dropping its group",
            type(exc).__name__, exc, exc_info=logger.isEnabledFor(logging.DEBUG),
        )
        return outcome
    finally:
        outcome.duration = time.perf_counter() - start
        env.task_durations.append(outcome.duration)
    candidates = [g for g in (scored if isinstance(scored, list) else [scored]) if g is not None]
    outcome.scores = [list(g["scores"]) for g in candidates if isinstance(g, dict) and g.get("scores")]
    if not candidates:
        outcome.reason = Skip.RETURNED_NONE
        env.stats[_stat_key(outcome.reason)] += 1
        return outcome
    if not validate:
        outcome.groups = candidates
        return outcome
    checked = check_groups(
        candidates, env.config.group_size, env.config.ensure_scores_are_not_same,
        env.run_state.max_seq_len if check_length else -1, env.stats, env.run_state.drops,
    )
    outcome.groups = checked
    outcome.dropped = [(Skip(key), message) for key, message in checked.dropped]
    if not outcome.groups:
        outcome.reason = outcome.dropped[0][0]
    return outcome


__all__ = ["Outcome", "Skip", "classify", "run_item"]
