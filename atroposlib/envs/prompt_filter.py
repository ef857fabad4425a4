"""Skip training items whose recent groups carried no GRPO signal, before sampling them.

A group whose rewards are all equal has zero advantage everywhere, so it teaches nothing; with
``ensure_scores_are_not_same`` the env drops it after sampling (DAPO's dynamic sampling), which
still pays for sampling it. Such items tend to
stay that way: an arithmetic problem the policy solved 8 times out of 8 is usually solved 8 of 8
the next time it comes round. Zheng et al. 2025, "Act Only When It Pays: Efficient Reinforcement
Learning for LLM Reasoning via Selective Rollouts" (GRESO, arXiv:2506.02177, Sec. 4) use that
temporal consistency to skip such prompts *before* rollout, probabilistically, so an item whose
policy changed still comes back now and then.

This is the simple form of that rule: an item whose last ``k`` groups were all zero-variance is
sampled with probability ``keep ** k`` (``k`` capped at ``max_streak``), any other item always.
The state is in memory only (a restarted env starts with every item unseen).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any


def item_key(item: Any) -> str:
    """A stable identity for an item: its JSON with sorted keys (``str`` for other values)."""
    return json.dumps(item, sort_keys=True, default=str)


class ZeroVarianceFilter:
    """Per-item streaks of zero-variance groups and the draw that skips such items.

    Args:
        keep: probability of sampling an item after ONE zero-variance group, in (0, 1];
            1.0 keeps every item (the filter is off).
        max_streak: the streak counted at most, so an item is sampled with probability at
            least ``keep ** max_streak``.
        max_draws: items drawn at most per :meth:`next_item` call; the last one drawn is
            returned even if it would be skipped (never loops forever when everything is solved).

    Raises:
        ValueError: ``keep`` is not in (0, 1], or ``max_streak`` / ``max_draws`` is below 1.
    """

    def __init__(self, keep: float, max_streak: int = 4, max_draws: int = 64):
        if not 0.0 < keep <= 1.0:
            raise ValueError(f"keep must be in (0, 1], got {keep}")
        if max_streak < 1 or max_draws < 1:
            raise ValueError(f"max_streak and max_draws must be >= 1, got {max_streak}, {max_draws}")
        self.keep, self.max_streak, self.max_draws = keep, max_streak, max_draws
        self.streaks: dict[str, int] = {}
        self.skipped = 0  # items skipped since the last take_skipped()

    def record(self, item: Any, scores: Sequence[float]) -> None:
        """Note a scored group of ``item``.

        Zero variance (more than one score, all equal) lengthens the item's streak; anything
        else ends it.
        """
        key = item_key(item)
        if len(scores) > 1 and max(scores) == min(scores):
            self.streaks[key] = min(self.streaks.get(key, 0) + 1, self.max_streak)
        else:
            self.streaks.pop(key, None)

    def keep_probability(self, item: Any) -> float:
        """``keep ** streak`` of ``item`` (1.0 for an item without a streak)."""
        return self.keep ** self.streaks.get(item_key(item), 0)

    def next_item(self, draw: Callable[[], Any], rng: random.Random) -> Any:
        """Draw items with ``draw()`` until one is kept (see the class); count the skipped ones."""
        item = draw()
        for _ in range(self.max_draws - 1):
            if rng.random() < self.keep_probability(item):
                return item
            self.skipped += 1
            item = draw()
        return item

    def take_skipped(self) -> int:
        """Items skipped since the last call (and reset the count)."""
        skipped, self.skipped = self.skipped, 0
        return skipped


__all__ = ["ZeroVarianceFilter", "item_key"]
