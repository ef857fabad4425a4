"""DeepSeek-R1-style rewards: ``formatreasoning``, ``accuracyx`` and their sum ``r1``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from atroposlib.rewards.accuracy_reward import AccuracyReward, answer_text
from atroposlib.rewards.registry import registry
from atroposlib.rewards.reward_function import (
    Completion,
    RewardFunction,
    broadcast,
    get_content,
)

_THINK = re.compile(r"^\s*<think>(.+?)</think>(.*)$", re.DOTALL)


def has_reasoning_format(text: str) -> bool:
    """Exactly one non-empty ``<think>...</think>`` block at the start, then a non-empty reply."""
    if text.count("<think>") != 1 or text.count("</think>") != 1:
        return False
    match = _THINK.match(text)
    return bool(match and match.group(1).strip() and match.group(2).strip())


@registry.register
class FormatReasoningReward(RewardFunction):
    """``reward_value`` when the completion has the R1 format (see :func:`has_reasoning_format`).

    Args:
        reward_value: score of a well-formatted completion (others get 0.0).
        **kwargs: ``weight`` (multiplier) and ``name`` (metric name), passed to
            :class:`RewardFunction`.
    """

    def __init__(self, reward_value: float = 0.5, **kwargs: Any):
        super().__init__(**kwargs)
        self.reward_value = reward_value

    def compute(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score each completion; see the class docstring for the keywords used."""
        return [
            self.reward_value if has_reasoning_format(get_content(c)) else 0.0
            for c in completions
        ]


@registry.register
class AccuracyXReward(RewardFunction):
    """``reward_value`` when the solution string appears in the answer (after ``</think>``).

    A string-level check for non-math answers; use ``accuracy`` for math.

    Args:
        exact_match: the stripped answer must equal the solution (case-insensitive) rather
            than contain it.
        reward_value: score of a correct completion (others get 0.0).
        **kwargs: ``weight`` (multiplier) and ``name`` (metric name), passed to
            :class:`RewardFunction`.
    """

    def __init__(self, exact_match: bool = False, reward_value: float = 1.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.exact_match = exact_match
        self.reward_value = reward_value

    def compute(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score each completion; see the class docstring for the keywords used."""
        solution = kwargs.get("solution", kwargs.get("answer"))
        if solution is None:
            raise ValueError("accuracyx needs solution=... (one per completion or one)")
        scores = []
        for completion, gold in zip(
            completions, broadcast(solution, len(completions), "solution"), strict=True
        ):
            answer = answer_text(get_content(completion)).strip().lower()
            gold = str(gold).strip().lower()
            ok = answer == gold if self.exact_match else bool(gold) and gold in answer
            scores.append(self.reward_value if ok else 0.0)
        return scores


@registry.register
class R1Reward(RewardFunction):
    """DeepSeek-R1 rule reward: ``format_weight * format + accuracy_weight * accuracy``.

    ``format`` is 1.0 for the ``<think>...</think> answer`` layout; ``accuracy`` is the
    math-verify :class:`AccuracyReward` on the text after ``</think>`` (DeepSeek-AI 2025,
    "DeepSeek-R1", arXiv:2501.12948, Sec. 2.2.2).

    Args:
        format_weight: weight of the format term.
        accuracy_weight: weight of the accuracy term.
        **kwargs: ``weight`` (overall multiplier) and ``name`` (metric name), passed to
            :class:`RewardFunction`.
    """

    def __init__(self, format_weight: float = 0.5, accuracy_weight: float = 1.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.format = FormatReasoningReward(reward_value=1.0, weight=format_weight)
        self.accuracy = AccuracyReward(weight=accuracy_weight)

    def compute(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score each completion; see the class docstring for the keywords used."""
        fmt = self.format(completions, **kwargs)
        acc = self.accuracy(completions, **kwargs)
        return [f + a for f, a in zip(fmt, acc, strict=True)]


def parse_reasoning_response(text: str) -> dict[str, Any]:
    """Split ``text`` into its ``<think>`` block and the reply after it (Atropos 0.4 helper).

    Returns:
        ``{"thinking_content": str, "response": str, "multiple_thinking": bool}``: with more
        than one ``<think>...</think>`` block, or none, ``thinking_content`` is ``""`` and
        ``response`` is the whole text; otherwise both parts, stripped.
    """
    blocks = re.findall(r"<think>.*?</think>", text, re.DOTALL)
    if len(blocks) != 1:
        return {"thinking_content": "", "response": text, "multiple_thinking": len(blocks) > 1}
    _, _, rest = text.partition("<think>")
    thinking, _, response = rest.partition("</think>")
    return {"thinking_content": thinking.strip(), "response": response.strip(),
            "multiple_thinking": False}


def format_reasoning_reward(completions: Sequence[Completion], **kwargs: Any) -> list[float]:
    """Atropos 0.4's function form of :class:`FormatReasoningReward` (0.5 per good completion)."""
    return FormatReasoningReward(reward_value=0.5).compute(completions, **kwargs)


def accuracy_reward(
    completions: Sequence[Completion], solution: Any, **kwargs: Any
) -> list[float]:
    """Atropos 0.4's function form of :class:`AccuracyXReward` (substring match, 1.0)."""
    return AccuracyXReward().compute(completions, solution=solution, **kwargs)


def r1_reward(completions: Sequence[Completion], solution: Any, **kwargs: Any) -> list[float]:
    """Atropos 0.4's function form of :class:`R1Reward` (0.5 format + 1.0 accuracy)."""
    return R1Reward().compute(completions, solution=solution, **kwargs)
