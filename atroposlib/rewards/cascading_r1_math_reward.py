r"""Atropos 0.4's ``cascading_r1_math_reward``: correctness first, a format bonus only if correct.

Plain functions, as upstream shipped them (``format_reward``, ``accuracy_reward``,
``cascading_r1_math_reward``), plus the registered class ``cascadingr1math`` so configs can name
it. The score of one completion is ``accuracy + (format if accuracy > 0 else 0)``: 0.0 (wrong),
1.0 (right) or 1.5 (right and in ``<think>...</think>answer`` form), so a well-formatted wrong
answer earns nothing.

Answers are judged with math-verify (:func:`~atroposlib.rewards.accuracy_reward.
math_equal`); a GSM8K-style gold ``"... #### 42"`` is reduced to ``42`` first, and a prediction
that math-verify cannot read is compared numerically through its ``#### N`` line.

Errors are not turned into 0.0 silently: a malformed completion raises
``TypeError`` (and, through :class:`RewardFunction`, ``RolloutError``).
"""

from __future__ import annotations

import re
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

#: ``<think>`` block, then an answer, with no further tags anywhere.
_THINK_THEN_ANSWER = re.compile(r"^<think>[^<]*</think>[^<]*$", re.DOTALL)
_GSM8K_ANSWER = re.compile(r"####\s*([^\n]*)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
#: Completions whose answer part holds more ``\boxed`` than this score 0 (boxing every number).
MAX_BOXED = 6


def get_completion_content(completion: Completion) -> str:
    """Upstream's name for :func:`~atroposlib.rewards.reward_function.get_content`."""
    return get_content(completion)


def _gold_text(gold: Any) -> str:
    """The answer part of a gold: the text after ``####`` (GSM8K), else the whole value."""
    text = str(gold)
    match = _GSM8K_ANSWER.search(text)
    return match.group(1).strip() if match else text.strip()


def _as_number(text: str) -> float | None:
    match = _NUMBER.fullmatch(text.strip().rstrip(".")) if text else None
    return float(match.group(0).replace(",", "")) if match else None


def is_correct(answer: str, gold: Any) -> bool:
    r"""Whether the answer part ``answer`` states ``gold``.

    math-verify first; when it disagrees, a ``#### N`` line of ``answer`` is compared with a
    numeric gold to within 1e-6 (GSM8K answers written without LaTeX).
    """
    gold_text = _gold_text(gold)
    if math_equal(gold_text, answer):
        return True
    gold_value = _as_number(gold_text)
    line = _GSM8K_ANSWER.search(answer)
    if gold_value is None or line is None:
        return False
    value = _as_number(line.group(1))
    return value is not None and abs(value - gold_value) < 1e-6


def format_reward(
    completions: Sequence[Completion], reward_value: float = 0.5, **kwargs: Any
) -> list[float]:
    """``reward_value`` for a ``<think>...</think>answer`` completion with no other tags, else 0.

    Args:
        completions: N completions (any shape :func:`get_content` accepts).
        reward_value: the bonus for the right form.
        **kwargs: ignored (reward functions are called with the dataset's columns).

    Returns:
        N floats.
    """
    return [
        reward_value if _THINK_THEN_ANSWER.match(get_content(c)) else 0.0 for c in completions
    ]


def accuracy_reward(
    completions: Sequence[Completion], solution: Any, **kwargs: Any
) -> list[float]:
    r"""1.0 when the text after ``</think>`` states ``solution``, else 0.0.

    Args:
        completions: N completions.
        solution: one gold for all or N golds (numbers, LaTeX, ``\boxed{..}`` or GSM8K
            ``"... #### 42"``).
        **kwargs: ignored (reward functions are called with the dataset's columns).

    Returns:
        N floats; a completion with more than :data:`MAX_BOXED` ``\boxed`` scores 0.

    Raises:
        ValueError: N golds were given for a different number of completions, or a gold is
            unreadable for math-verify.
    """
    golds = broadcast(solution, len(completions), "solution")
    scores = []
    for completion, gold in zip(completions, golds, strict=True):
        answer = answer_text(get_content(completion))
        if answer.count("\\boxed") > MAX_BOXED:
            scores.append(0.0)
        else:
            scores.append(1.0 if is_correct(answer, gold) else 0.0)
    return scores


def cascading_r1_math_reward(
    completions: Sequence[Completion], solution: Any, **kwargs: Any
) -> list[float]:
    """Accuracy plus the format bonus, the bonus counted only for correct answers.

    Returns:
        N floats in {0.0, 1.0, 1.0 + 0.5}.
    """
    accuracy = accuracy_reward(completions, solution)
    form = format_reward(completions)
    return [a + (f if a > 0 else 0.0) for a, f in zip(accuracy, form, strict=True)]


@registry.register
class CascadingR1MathReward(RewardFunction):
    """Registered form of :func:`cascading_r1_math_reward` (name ``cascadingr1math``).

    Keywords of :meth:`compute`: ``solution`` (one for all or one per completion).

    Args:
        format_bonus: added to a correct answer in ``<think>...</think>answer`` form (0.5).
        **kwargs: ``weight`` (multiplier) and ``name`` (metric name), passed to
            :class:`RewardFunction`.
    """

    def __init__(self, format_bonus: float = 0.5, **kwargs: Any):
        super().__init__(**kwargs)
        self.format_bonus = format_bonus

    def compute(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score each completion; see the class docstring."""
        if kwargs.get("solution") is None:
            raise ValueError("cascadingr1math needs solution=... (one per completion or one)")
        accuracy = accuracy_reward(completions, kwargs["solution"])
        form = format_reward(completions, reward_value=self.format_bonus)
        return [a + (f if a > 0 else 0.0) for a, f in zip(accuracy, form, strict=True)]
