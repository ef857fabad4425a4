"""Rollout outcomes on the env side: run a group's members one by one, and say what became of each.

Each member of a group ends *completed* (it stays in the group's ``tokens``/``masks``/``scores``
lists), *masked* (rolled out, kept for inspection, never trained: ``reason`` ``truncated``,
``format`` or ``env``) or *failed* (no usable rollout and no score: ``kind`` ``inference``,
``timeout``, ``env_error`` or ``sandbox``). Masked and failed members travel in the group's
``excluded`` list (:class:`atroposlib.api.models.ExcludedMember`), so they count in no group
statistic and a stock Atropos trainer, which reads only the parallel lists, never sees them.

What happens to a group with failed members is the env's ``failed_rollout_policy``
(:data:`FailedRolloutPolicy`); see ``docs/guides/rollout-outcomes.md``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from atroposlib.api.models import MAX_OUTCOME_MESSAGE_CHARS
from atroposlib.errors import InferenceError, RolloutTimeoutError

T = TypeVar("T")

#: What an env does with a group some of whose members failed: ``retry`` (the default) rolls
#: the failed members out again, at most ``max_rollout_retries`` times each, and drops the group
#: when one still fails, so only whole groups are sent (they pack into run-api's exact-size
#: batches); ``shrink`` keeps the completed members when at least ``min_completed_rollouts`` of
#: them completed; ``drop`` drops the whole group at the first failure, as atroposlib did before
#: outcomes existed. A dropped group raises its first failure again.
FailedRolloutPolicy = Literal["retry", "shrink", "drop"]


def failure_kind(exc: BaseException) -> str:
    """The wire ``kind`` of a rollout's exception.

    :class:`~atroposlib.errors.RolloutTimeoutError` (past ``rollout_timeout``) or another
    ``TimeoutError`` -> ``timeout``;
    ``InferenceError`` or a transient network/server error -> ``inference``; anything else
    (the scorer, a parser, a tool) -> ``env_error``. An exception may name its own kind with a
    ``rollout_failure_kind`` attribute (e.g. ``"sandbox"`` from a code sandbox).
    """
    from atroposlib.inference.clients.base import is_transient_error

    own = getattr(exc, "rollout_failure_kind", None)
    if own in ("inference", "timeout", "env_error", "sandbox"):
        return own
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, InferenceError) or is_transient_error(exc):
        return "inference"
    return "env_error"


def describe(exc: BaseException, timeout: float | None = None) -> str:
    """A one-line message for a failed member (bounded to the wire's message length)."""
    if isinstance(exc, TimeoutError) and not str(exc) and timeout is not None:
        text = f"rollout ran past rollout_timeout={timeout:g} s"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return text[:MAX_OUTCOME_MESSAGE_CHARS]


@dataclass
class Member:
    """One member of a group being rolled out.

    Attributes:
        rollout_id: stable id, ``<group id>/<index>``, kept across retries.
        attempt: 0 for the first try, k after k retries.
        value: what the rollout returned (None until it completed).
        error: the exception of the last failed attempt (None when it completed).
    """

    rollout_id: str
    attempt: int = 0
    value: Any = None
    error: BaseException | None = None

    @property
    def completed(self) -> bool:
        """The last attempt returned without raising."""
        return self.error is None


def new_rollout_ids(n: int) -> list[str]:
    """``n`` fresh rollout ids of one group: ``<12 hex chars>/<i>`` (unique with high probability)."""
    group = uuid.uuid4().hex[:12]
    return [f"{group}/{i}" for i in range(n)]


async def run_members(
    roll: Callable[[int], Awaitable[T]],
    n: int,
    *,
    timeout: float | None,
    retries: int = 0,
    ids: list[str] | None = None,
) -> list[Member]:
    """Run ``n`` rollouts concurrently, each bounded by ``timeout``; never raises for a member.

    Args:
        roll: ``roll(i)`` rolls out member ``i`` (called again on retry).
        n: members in the group.
        timeout: seconds each attempt may take (``asyncio.timeout``); None or <= 0 = none.
            An attempt past it fails with :class:`~atroposlib.errors.RolloutTimeoutError`.
        retries: times a failed member is rolled out again (all failed members together).
        ids: the members' rollout ids (default: :func:`new_rollout_ids`).

    Returns:
        ``n`` :class:`Member` in order; a failed one has ``error`` set.

    Raises:
        asyncio.CancelledError: the whole group was cancelled (never caught here).
    """
    members = [Member(rid) for rid in (ids if ids is not None else new_rollout_ids(n))]
    limit = timeout if timeout is not None and timeout > 0 else None

    async def one(i: int) -> None:
        member = members[i]
        bound = asyncio.timeout(limit)
        try:
            async with bound:
                member.value = await roll(i)
            member.error = None
        except asyncio.CancelledError:
            raise
        except TimeoutError as exc:
            # our own limit expired -> RolloutTimeoutError (saying which limit); a TimeoutError
            # the rollout raised itself (e.g. a client's transport timeout) is kept as it is
            member.error = RolloutTimeoutError(
                f"rollout ran past rollout_timeout={limit:g} s") if bound.expired() else exc
        except Exception as exc:  # noqa: BLE001 - a member's failure is recorded, not raised
            member.error = exc

    await asyncio.gather(*(one(i) for i in range(n)))
    for _ in range(max(retries, 0)):
        failed = [i for i, m in enumerate(members) if not m.completed]
        if not failed:
            break
        for i in failed:
            members[i].attempt += 1
        await asyncio.gather(*(one(i) for i in failed))
    return members


def failed_entry(member: Member, timeout: float | None = None) -> dict[str, Any]:
    """The ``excluded`` entry of a failed member (no score, no sequence)."""
    assert member.error is not None
    return {"rollout_id": member.rollout_id, "attempt": member.attempt, "outcome": "failed",
            "kind": failure_kind(member.error), "message": describe(member.error, timeout)}


def masked_entry(rollout_id: str, attempt: int, reason: str, *, message: str | None = None,
                 score: float | None = None, tokens: list[int] | None = None,
                 masks: list[int] | None = None) -> dict[str, Any]:
    """The ``excluded`` entry of a masked member (its sequence and score kept for inspection)."""
    entry: dict[str, Any] = {"rollout_id": rollout_id, "attempt": attempt, "outcome": "masked",
                             "reason": reason}
    for key, value in (("message", message), ("score", score), ("tokens", tokens),
                       ("masks", masks)):
        if value is not None:
            entry[key] = value
    return entry


def keep_group(members: list[Member], policy: str, min_completed_rollouts: int) -> bool:
    """Whether a group whose members ended as ``members`` is sent (after retries).

    A group without failures is always sent; with ``shrink``, one with failures is sent when
    at least ``min_completed_rollouts`` members completed.

    Raises:
        Exception: the first failed member's error, when ``policy`` is ``drop`` or ``retry``
            (after its retries) and a member failed, or when no member completed (so the runner
            classifies and counts it, and re-queues an item whose inference failed, exactly as
            for a group that raised).
    """
    failed = [m for m in members if not m.completed]
    if not failed:
        return True
    if policy != "shrink" or len(failed) == len(members):
        raise failed[0].error  # type: ignore[misc]
    return len(members) - len(failed) >= min_completed_rollouts


def attach_outcomes(group: dict[str, Any], members: list[Member], *, timeout: float | None = None,
                    stats: Any = None) -> dict[str, Any]:
    """Write the members' outcomes into ``group`` (in place), whose rows are the completed members.

    Sets ``rollout_ids`` and ``attempts`` (``[G]``, completed members in order; left unset when
    the group's rows are no longer one per completed member) and, when a
    member failed, appends its entry to ``excluded`` (entries already there, e.g. masked ones,
    are kept). ``stats`` (a ``Counter``), when given, gets ``members_failed_<kind>`` += 1 per
    failed member.

    Returns:
        ``group``.
    """
    done = [m for m in members if m.completed]
    if len(group["tokens"]) == len(done):  # else a hook reshaped the group: ids unknown
        group["rollout_ids"] = [m.rollout_id for m in done]
        group["attempts"] = [m.attempt for m in done]
    failed = [failed_entry(m, timeout) for m in members if not m.completed]
    if failed:
        group["excluded"] = [*(group.get("excluded") or []), *failed]
    if stats is not None:
        for entry in failed:
            stats[f"members_failed_{entry['kind']}"] += 1
    return group


def excluded_count(group: dict[str, Any]) -> int:
    """Members of ``group`` that are in its ``excluded`` list (0 when it has none)."""
    return len(group.get("excluded") or ())


def exclude_member(group: dict[str, Any], index: int, reason: str,
                   message: str | None = None) -> dict[str, Any]:
    """Mask member ``index`` of ``group``, in place: move it from the lists to ``excluded``.

    For an env that decides after scoring that a rollout must not be trained on (a reply in
    the wrong format, an episode the env could not judge): the sequence and its score are kept
    in the ``excluded`` entry for inspection and weighted 0 (it is in no list the trainer
    reads). Every per-sequence list of the group loses row ``index``.

    Args:
        group: a ``ScoredDataGroup``.
        index: the member's row in ``tokens``.
        reason: ``truncated``, ``format`` or ``env``.
        message: optional detail.

    Returns:
        The excluded entry that was added.

    Raises:
        IndexError: ``index`` is not a row of the group.
    """
    n = len(group["tokens"])
    if not 0 <= index < n:
        raise IndexError(f"member {index} is not in a group of {n}")
    ids = group.get("rollout_ids")
    attempts = group.get("attempts")
    entry = masked_entry(
        ids[index] if ids else f"{uuid.uuid4().hex[:12]}/{index}",
        attempts[index] if attempts else 0, reason, message=message,
        score=float(group["scores"][index]), tokens=list(group["tokens"][index]),
        masks=list(group["masks"][index]))
    for key, rows in list(group.items()):
        if key not in ("excluded", "group_overrides", "generation_params") and \
                isinstance(rows, list) and len(rows) == n:
            del rows[index]
    group["excluded"] = [*(group.get("excluded") or []), entry]
    return entry


__all__ = [
    "FailedRolloutPolicy",
    "Member",
    "attach_outcomes",
    "excluded_count",
    "describe",
    "exclude_member",
    "failed_entry",
    "failure_kind",
    "keep_group",
    "masked_entry",
    "new_rollout_ids",
    "run_members",
]
