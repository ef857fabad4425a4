"""``reasoningsteps``: rewards completions that lay out explicit, enumerated reasoning steps."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from atroposlib.rewards.registry import registry
from atroposlib.rewards.reward_function import Completion, RewardFunction, get_content

_STEP_PATTERNS = (
    r"(?im)^\s*step\s*\d+\s*[:.)]",  # "Step 1:"
    r"(?m)^\s*\d+[.)]\s+\S",  # "1. ..." / "2) ..."
    r"(?m)^\s*[-*\u2022]\s+\S",  # bullets
    r"(?i)\b(?:first|second|third|next|then|finally|therefore)\b,",  # "First, ..."
)


def count_steps(text: str) -> int:
    """Number of step markers in ``text``: "Step N:", numbered lines, bullets, "First," etc."""
    return sum(len(re.findall(pattern, text)) for pattern in _STEP_PATTERNS)


@registry.register
class ReasoningStepsReward(RewardFunction):
    """``base_score + (1 - base_score) * min(1, steps / min_steps)``; 0 for short texts.

    Args:
        min_steps: number of step markers that earns the full 1.0 (>= 1).
        min_words: completions with fewer words score 0.0.
        base_score: score of a long-enough completion with no step markers.
        **kwargs: ``weight`` (multiplier) and ``name`` (metric name), passed to
            :class:`RewardFunction`.
    """

    def __init__(self, min_steps: int = 3, min_words: int = 10, base_score: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        if min_steps < 1:
            raise ValueError(f"min_steps must be >= 1, got {min_steps}")
        self.min_steps = min_steps
        self.min_words = min_words
        self.base_score = base_score

    def compute(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score each completion; see the class docstring for the keywords used."""
        scores = []
        for completion in completions:
            text = get_content(completion)
            if len(text.split()) < self.min_words:
                scores.append(0.0)
                continue
            frac = min(1.0, count_steps(text) / self.min_steps)
            scores.append(self.base_score + (1.0 - self.base_score) * frac)
        return scores


def reasoning_steps_reward(completions: Sequence[Completion], **kwargs: Any) -> list[float]:
    """Atropos 0.4's function form of :class:`ReasoningStepsReward` (defaults, unweighted)."""
    return ReasoningStepsReward().compute(completions, **kwargs)
