"""``combined``: a weighted sum of several registered rewards, optionally normalised."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from atroposlib.rewards.registry import registry
from atroposlib.rewards.reward_function import Completion, RewardFunction


@registry.register
class CombinedReward(RewardFunction):
    """Sum of sub-rewards (each already multiplied by its own weight).

    Normalisation of the per-completion sum:
        ``none``: the plain sum; ``sum``: divided by the sum of the sub-reward weights;
        ``minmax``: rescaled to [0, 1] across the completions of this call (all 0.0 when
        they are equal).

    Args:
        rewards: sub-reward specs accepted by ``registry.create`` (names or
            ``{"type": ..., "weight": ...}`` dicts); at least one.
        normalization: ``none``, ``sum`` or ``minmax``.
        **kwargs: ``weight`` (overall multiplier) and ``name`` (metric name), passed to
            :class:`RewardFunction`.
    """

    def __init__(
        self,
        rewards: Sequence[str | Mapping[str, Any] | RewardFunction] = (),
        normalization: Literal["none", "sum", "minmax"] = "none",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if not rewards:
            raise ValueError("combined reward needs rewards=[...], e.g. ['format', 'accuracy']")
        if normalization not in ("none", "sum", "minmax"):
            raise ValueError(f"normalization must be none, sum or minmax, got {normalization!r}")
        self.rewards = [registry.create(spec) for spec in rewards]
        self.normalization = normalization

    def compute(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score each completion; see the class docstring for the keywords used."""
        totals = [0.0] * len(completions)
        metrics: dict[str, float] = {}
        for reward in self.rewards:
            for i, score in enumerate(reward(completions, **kwargs)):
                totals[i] += score
            metrics.update(reward.metrics)
        self.sub_metrics = metrics
        if self.normalization == "sum":
            total_weight = sum(abs(r.weight) for r in self.rewards) or 1.0
            totals = [t / total_weight for t in totals]
        elif self.normalization == "minmax" and totals:
            lo, hi = min(totals), max(totals)
            totals = [0.0 if hi == lo else (t - lo) / (hi - lo) for t in totals]
        return totals

    def __call__(self, completions, **kwargs):  # noqa: D102 - adds sub-reward metrics
        out = super().__call__(completions, **kwargs)
        self.metrics.update(getattr(self, "sub_metrics", {}))
        return out
