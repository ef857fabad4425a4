"""``repetitionpenalty``: a non-positive reward proportional to repeated word n-grams."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from atroposlib.rewards.registry import registry
from atroposlib.rewards.reward_function import Completion, RewardFunction, get_content


def ngram_repetition(text: str, ngram_size: int) -> float:
    """Fraction of word n-grams in ``text`` that repeat an earlier n-gram, in [0, 1).

    ``1 - unique / total`` over lower-cased word n-grams; 0.0 when the text has fewer than
    ``ngram_size`` words.
    """
    words = re.findall(r"\w+", text.lower())
    grams = [tuple(words[i : i + ngram_size]) for i in range(len(words) - ngram_size + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


@registry.register
class RepetitionPenaltyReward(RewardFunction):
    """``max_penalty * repetition`` where repetition is the repeated n-gram fraction.

    The n-gram repetition penalty of Yeo et al. 2025 (arXiv:2502.03373, Sec. 4.3) in the
    simplified form used by Open-R1. Repetition below ``threshold`` is not penalised; texts
    shorter than ``min_words`` get ``short_text_penalty``.

    Args:
        ngram_size: words per n-gram (>= 1).
        max_penalty: reward of a fully repetitive text (<= 0).
        threshold: repetition fractions at or below this give 0.0.
        min_words: texts with fewer words get ``short_text_penalty``.
        short_text_penalty: reward for texts shorter than ``min_words`` (<= 0).
        **kwargs: ``weight`` (multiplier) and ``name`` (metric name), passed to
            :class:`RewardFunction`.
    """

    def __init__(
        self,
        ngram_size: int = 3,
        max_penalty: float = -1.0,
        threshold: float = 0.05,
        min_words: int = 0,
        short_text_penalty: float = 0.0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if ngram_size < 1:
            raise ValueError(f"ngram_size must be >= 1, got {ngram_size}")
        if max_penalty > 0 or short_text_penalty > 0:
            raise ValueError("max_penalty and short_text_penalty must be <= 0 (penalties)")
        self.ngram_size = ngram_size
        self.max_penalty = max_penalty
        self.threshold = threshold
        self.min_words = min_words
        self.short_text_penalty = short_text_penalty

    def compute(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score each completion; see the class docstring for the keywords used."""
        scores = []
        for completion in completions:
            text = get_content(completion)
            if len(text.split()) < self.min_words:
                scores.append(self.short_text_penalty)
                continue
            rep = ngram_repetition(text, self.ngram_size)
            scores.append(0.0 if rep <= self.threshold else self.max_penalty * rep)
        return scores


def repetition_penalty_reward(
    completions: Sequence[Completion], threshold: float = 0.05, **kwargs: Any
) -> list[float]:
    """Atropos 0.4's function form of :class:`RepetitionPenaltyReward` (unweighted).

    Returns:
        N floats in [``max_penalty``, 0]; 0.0 means no repetition above ``threshold``.
    """
    return RepetitionPenaltyReward(threshold=threshold).compute(completions, **kwargs)
