"""``cosinelength``: correctness reward shaped by completion length on a cosine schedule."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from atroposlib.rewards.accuracy_reward import answer_text, math_equal
from atroposlib.rewards.registry import registry
from atroposlib.rewards.reward_function import (
    Completion,
    RewardFunction,
    broadcast,
    get_content,
)


def cosine_schedule(length: float, max_length: float, r_0: float, r_l: float) -> float:
    """Cosine interpolation from ``r_0`` at length 0 to ``r_l`` at ``max_length``.

    ``r_l + 0.5 * (r_0 - r_l) * (1 + cos(pi * length / max_length))``: the CosFn of Yeo et al.
    2025, "Demystifying Long Chain-of-Thought Reasoning in LLMs", arXiv:2502.03373, Sec. 4.1.

    Args:
        length: generated length (same unit as ``max_length``), clipped to [0, max_length].
        max_length: the length at which the schedule reaches ``r_l``; > 0.
        r_0: reward at length 0.
        r_l: reward at ``max_length``.
    """
    t = min(max(length, 0.0), max_length)
    return r_l + 0.5 * (r_0 - r_l) * (1.0 + math.cos(math.pi * t / max_length))


@registry.register
class CosineLengthReward(RewardFunction):
    """Length-scaled correctness reward (Yeo et al. 2025, arXiv:2502.03373, "cosine reward").

    Correct answers get ``cosine_schedule(L, max_length, correct_r0, correct_rl)`` (short
    correct answers earn most); wrong answers get ``cosine_schedule(L, max_length, wrong_r0,
    wrong_rl)`` (short wrong answers are penalised most, so the policy keeps thinking when it
    is unsure); a completion of ``max_length`` or more gets ``exceed_reward``. This is the
    paper's length-based reward; Atropos 0.4's ``cosinescaled`` was an embedding-similarity
    reward that needs a model download and is not shipped.

    Keywords of :meth:`compute`:
        ``solution``: reference answers (checked with math-verify), or
        ``correct``: booleans, one per completion (overrides ``solution``);
        ``lengths``: generated token counts, one per completion (otherwise the ``tokenizer``
        option counts tokens, or whitespace-separated words are counted).

    Args:
        max_length: length (tokens/words) at which the schedule ends; > 0.
        correct_r0: reward of a correct answer of length 0 (paper default 2.0; here 1.0).
        correct_rl: reward of a correct answer at ``max_length`` (paper 1.0; here 0.5).
        wrong_r0: reward of a wrong answer of length 0 (paper -10; here -1.0).
        wrong_rl: reward of a wrong answer at ``max_length`` (paper 0; here -0.5).
        exceed_reward: reward when the length reaches ``max_length`` (paper -10; here -1.0).
        tokenizer: optional object with ``encode(text) -> list[int]`` to count tokens.
        **kwargs: ``weight`` (multiplier) and ``name`` (metric name), passed to
            :class:`RewardFunction`.
    """

    def __init__(
        self,
        max_length: int = 1000,
        correct_r0: float = 1.0,
        correct_rl: float = 0.5,
        wrong_r0: float = -1.0,
        wrong_rl: float = -0.5,
        exceed_reward: float = -1.0,
        tokenizer: Any = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if max_length <= 0:
            raise ValueError(f"max_length must be > 0, got {max_length}")
        self.max_length = max_length
        self.correct = (correct_r0, correct_rl)
        self.wrong = (wrong_r0, wrong_rl)
        self.exceed_reward = exceed_reward
        self.tokenizer = tokenizer

    def _length(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(text, add_special_tokens=False))
        return len(text.split())

    def compute(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score each completion; see the class docstring for the keywords used."""
        n = len(completions)
        texts = [get_content(c) for c in completions]
        if kwargs.get("correct") is not None:
            correct = [bool(c) for c in broadcast(kwargs["correct"], n, "correct")]
        elif kwargs.get("solution") is not None:
            golds = broadcast(kwargs["solution"], n, "solution")
            correct = [
                math_equal(str(g), answer_text(t)) for g, t in zip(golds, texts, strict=True)
            ]
        else:
            raise ValueError("cosinelength needs correct=[...] or solution=... to judge answers")
        if kwargs.get("lengths") is not None:
            lengths = [int(x) for x in broadcast(kwargs["lengths"], n, "lengths")]
        else:
            lengths = [self._length(t) for t in texts]
        scores = []
        for ok, length in zip(correct, lengths, strict=True):
            if length >= self.max_length:
                scores.append(self.exceed_reward)
            else:
                r_0, r_l = self.correct if ok else self.wrong
                scores.append(cosine_schedule(length, self.max_length, r_0, r_l))
        return scores
