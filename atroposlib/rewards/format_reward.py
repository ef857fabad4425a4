"""``format``: rewards completions that use the expected XML-style tags, e.g. <think>/<answer>."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from atroposlib.rewards.registry import registry
from atroposlib.rewards.reward_function import Completion, RewardFunction, get_content


@registry.register
class FormatReward(RewardFunction):
    """Fraction of ``preferred_tags`` that appear as a well-formed ``<tag>...</tag>`` pair.

    A tag counts when it opens once, closes once, the close follows the open, and the
    enclosed text is not blank.

    Args:
        preferred_tags: tag names to look for (default ``["think", "answer"]``).
        require_all_tags: 1.0 only when every tag is present, else 0.0 (no partial credit).
        case_sensitive: match tag names case-sensitively.
        **kwargs: ``weight`` (multiplier) and ``name`` (metric name), passed to
            :class:`RewardFunction`.
    """

    def __init__(
        self,
        preferred_tags: Sequence[str] | None = None,
        require_all_tags: bool = False,
        case_sensitive: bool = False,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.preferred_tags = list(preferred_tags or ["think", "answer"])
        if not self.preferred_tags:
            raise ValueError("preferred_tags is empty; name at least one tag, e.g. ['answer']")
        self.require_all_tags = require_all_tags
        self.flags = 0 if case_sensitive else re.IGNORECASE

    def _has_tag(self, text: str, tag: str) -> bool:
        t = re.escape(tag)
        opens = re.findall(rf"<{t}>", text, self.flags)
        closes = re.findall(rf"</{t}>", text, self.flags)
        if len(opens) != 1 or len(closes) != 1:
            return False
        match = re.search(rf"<{t}>(.*?)</{t}>", text, self.flags | re.DOTALL)
        return bool(match and match.group(1).strip())

    def compute(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score each completion; see the class docstring for the keywords used."""
        scores = []
        for completion in completions:
            text = get_content(completion)
            found = sum(self._has_tag(text, tag) for tag in self.preferred_tags)
            if self.require_all_tags:
                scores.append(1.0 if found == len(self.preferred_tags) else 0.0)
            else:
                scores.append(found / len(self.preferred_tags))
        return scores


def format_reward(
    completions: Sequence[Completion], preferred_tags: Sequence[str] | None = None, **kwargs: Any
) -> list[float]:
    """Atropos 0.4's function form of :class:`FormatReward` (unweighted).

    Args:
        completions: N completions.
        preferred_tags: tag names to look for (default ``think``, ``answer``).
        **kwargs: passed on to :meth:`FormatReward.compute`.

    Returns:
        N floats.
    """
    return FormatReward(preferred_tags=preferred_tags).compute(completions, **kwargs)
