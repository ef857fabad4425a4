"""The env's tally of the groups it sampled and then dropped, for run-api's run ledger.

A group the env's own checks drop after sampling (all-same scores under
``ensure_scores_are_not_same``, a wrong size, a sequence too long, too few completed members)
never reaches run-api, yet its rollouts were sampled. :class:`DropTally` counts them, and the
serve loop's outbox hands the counts to run-api in the optional ``env_drops`` field of the next
group it sends (:class:`~atroposlib.api.models.EnvDrops`). Counts ride on that group's POST, so
its ``Idempotency-Key`` makes a retry count them once; stock servers ignore the field. Counts
still held when the env stops (or is killed) are lost, and run-api never counted those rollouts
as sampled, so its ledger still closes. See ``docs/guides/ledger.md``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from atroposlib.api.ledger import group_counts

__all__ = ["DropTally", "attach_drops"]


@dataclass
class DropTally:
    """Rollouts and completion tokens of the groups dropped since the last :meth:`take`.

    Attributes:
        groups: groups dropped.
        completed, masked, failed: their rollouts by outcome (each retry is a failed rollout).
        tokens: completion tokens (labels that are not -100) of their kept members.
        masked_tokens: completion tokens of their masked members that carry a sequence.
        groups_by_reason, tokens_by_reason: the same split by drop reason.
    """

    groups: int = 0
    completed: int = 0
    masked: int = 0
    failed: int = 0
    tokens: int = 0
    masked_tokens: int = 0
    groups_by_reason: Counter[str] = field(default_factory=Counter)
    tokens_by_reason: Counter[str] = field(default_factory=Counter)

    def add(self, group: Any, reason: str) -> None:
        """Count one dropped ``ScoredDataGroup``.

        A malformed one (reason ``invalid``, or not a dict) counts as a group only: its rows
        cannot be trusted.
        """
        self.groups += 1
        self.groups_by_reason[reason] += 1
        if not isinstance(group, dict) or reason == "invalid":
            return
        try:
            counts = group_counts(group)
        except (TypeError, ValueError, AttributeError):  # a malformed group: its rows are unknown
            return
        for name in ("completed", "masked", "failed", "tokens", "masked_tokens"):
            setattr(self, name, getattr(self, name) + counts[name])
        self.tokens_by_reason[reason] += counts["tokens"]

    def add_members(self, members: Any, reason: str) -> None:
        """Count a group dropped before it was built, from its rollout members.

        ``members``: :class:`~atroposlib.envs.outcomes.Member` objects. Their tokens are not
        known (the group was never built), so only the rollouts count: each completed member one
        completed rollout, each member ``attempt`` failed ones (plus one when it failed).
        """
        self.groups += 1
        self.groups_by_reason[reason] += 1
        self.tokens_by_reason[reason] += 0
        for m in members:
            self.failed += m.attempt + (0 if m.completed else 1)
            self.completed += 1 if m.completed else 0

    def take(self) -> dict[str, Any] | None:
        """The counts as an ``env_drops`` wire object, and start again; None when nothing was dropped."""
        if not self.groups:
            return None
        report = {"groups": self.groups, "completed": self.completed, "masked": self.masked,
                  "failed": self.failed, "tokens": self.tokens, "masked_tokens": self.masked_tokens,
                  "groups_by_reason": dict(self.groups_by_reason),
                  "tokens_by_reason": {k: v for k, v in self.tokens_by_reason.items() if v}}
        fresh = DropTally()
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(fresh, name))
        return report


def attach_drops(group: dict[str, Any], tally: DropTally | None) -> dict[str, Any]:
    """Put the tally's counts on ``group`` as ``env_drops`` (once, before its first POST)."""
    if tally is not None and group.get("env_drops") is None:
        report = tally.take()
        if report is not None:
            group["env_drops"] = report
    return group
