"""``accuracy``: 1.0 when the completion's final answer equals the solution (math-verify)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from atroposlib.rewards.registry import registry
from atroposlib.rewards.reward_function import (
    Completion,
    RewardFunction,
    broadcast,
    get_content,
)


def answer_text(text: str, split_on_think_tag: bool = True) -> str:
    """Return the part of ``text`` that holds the answer: after the last ``</think>`` if any."""
    if split_on_think_tag and "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    return text


def math_equal(gold: str, prediction: str, float_rounding: int = 6) -> bool:
    r"""Whether ``prediction`` states the same mathematical answer as ``gold`` (math-verify).

    The gold may be bare (``"42"``, ``"\\frac{1}{2}"``) or boxed. math-verify's timeouts rely
    on ``signal.alarm``, which only works in the main thread; from other threads they are
    disabled (``parsing_timeout=None``, ``timeout_seconds=None``), else math-verify raises.

    Args:
        gold: the reference answer.
        prediction: the model's text (its last ``\\boxed{}`` or final expression is used).
        float_rounding: decimal places compared for floats.

    Returns:
        True when math-verify parses both and judges them equal.
    """
    from math_verify import parse, verify

    in_main = threading.current_thread() is threading.main_thread()
    timeout = 5 if in_main else None
    gold_text = gold if ("\\boxed" in gold or "$" in gold) else f"${gold}$"
    parsed_gold = parse(gold_text, parsing_timeout=timeout)
    if not parsed_gold:
        parsed_gold = parse(gold, parsing_timeout=timeout)
    if not parsed_gold:
        raise ValueError(
            f"math-verify could not parse the solution {gold!r}; give it as a number or LaTeX"
        )
    parsed_pred = parse(prediction, parsing_timeout=timeout)
    if not parsed_pred:
        return False
    return bool(
        verify(parsed_gold, parsed_pred, float_rounding=float_rounding, timeout_seconds=timeout)
    )


@registry.register
class AccuracyReward(RewardFunction):
    r"""1.0 if the completion's answer matches ``solution`` under math-verify, else 0.0.

    Keywords of :meth:`compute`: ``solution`` (alias ``answer`` / ``gold``), one per
    completion or one for all.

    Args:
        split_on_think_tag: score only the text after the last ``</think>``.
        float_rounding: decimal places compared for floating-point answers.
        max_boxed_threshold: completions with more ``\\boxed{}`` than this score 0 (guards
            against "box every number" reward hacking).
        **kwargs: ``weight`` (multiplier) and ``name`` (metric name), passed to
            :class:`RewardFunction`.
    """

    def __init__(
        self,
        split_on_think_tag: bool = True,
        float_rounding: int = 6,
        max_boxed_threshold: int = 6,
        tolerance: float | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.split_on_think_tag = split_on_think_tag
        self.float_rounding = float_rounding
        self.max_boxed_threshold = max_boxed_threshold
        # ``tolerance`` is accepted for Atropos 0.4 configs; math-verify compares by rounding.
        self.tolerance = tolerance

    def compute(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score each completion; see the class docstring for the keywords used."""
        solution = next(
            (kwargs[k] for k in ("solution", "answer", "gold") if kwargs.get(k) is not None),
            None,
        )
        if solution is None:
            raise ValueError("accuracy reward needs solution=... (one per completion or one)")
        solutions = broadcast(solution, len(completions), "solution")
        scores = []
        for completion, gold in zip(completions, solutions, strict=True):
            text = answer_text(get_content(completion), self.split_on_think_tag)
            if text.count("\\boxed") > self.max_boxed_threshold:
                scores.append(0.0)
                continue
            scores.append(1.0 if math_equal(str(gold), text, self.float_rounding) else 0.0)
        return scores


def accuracy_reward(
    completions: Sequence[Completion],
    solution: Any = None,
    ground_truth: Any = None,
    **kwargs: Any,
) -> list[float]:
    """Atropos 0.4's function form of :class:`AccuracyReward` (defaults, unweighted).

    Args:
        completions: N completions.
        solution: one gold for all or N golds.
        ground_truth: used instead of ``solution`` when given (Atropos 0.4's keyword).
        **kwargs: passed on to :meth:`AccuracyReward.compute`.

    Returns:
        N floats in {0.0, 1.0}.
    """
    gold = ground_truth if ground_truth is not None else solution
    return AccuracyReward().compute(completions, solution=gold, **kwargs)
