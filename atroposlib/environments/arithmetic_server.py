"""Procedurally generated arithmetic ("What is 7 + 12?") scored with math-verify: a CPU-sized RL task.

Designed so the bundled SmolLM2-135M-Instruct shows learning within minutes on a CPU: at
difficulty 2 (operands 1..20, addition) its greedy accuracy is about 35% and about 10% of
temperature-1.0 samples are right, with about half of the groups of 8 holding at least one right
answer, so the GRPO reward is not sparse. A reply counts as correct when it ends on its own
(``finish_reason == "stop"``, within ``max_tokens``) and math-verify finds the right number
(the last number of the reply).

No dataset: problems come from a seeded generator. Operand pairs are split into train and
held-out pairs by a fixed hash, so ``evaluate`` (greedy, temperature 0) measures accuracy on
problems the policy never trains on.

``--env.curriculum true`` adapts the training problems to the policy (AdaRFT's adaptive
curriculum, Shi et al. 2025, arXiv:2504.05520): operands go up to a target that rises while
groups solve more than ``curriculum_target`` of their replies and falls while they solve less
(:func:`curriculum_update`), so fewer groups come back all solved or all failed. The held-out
problems keep the difficulty's whole range.

Run it (see ``atropos-launch configs/quickstart-cpu.yaml`` for the whole loop)::

    python environments/arithmetic_server.py serve --env.difficulty 2 \
        --openai.base_url http://127.0.0.1:9100/v1 --openai.model_name smollm2
    python environments/arithmetic_server.py evaluate --openai.base_url http://127.0.0.1:9100/v1
"""

from __future__ import annotations

import math
import operator
import random
import re
import threading
from typing import Any, Literal

from pydantic import Field

from atroposlib.envs.single_turn import SingleTurnEnv, SingleTurnEnvConfig

#: difficulty -> (smallest operand, largest operand, operators)
DIFFICULTIES: dict[int, tuple[int, int, tuple[str, ...]]] = {
    1: (1, 9, ("+",)),
    2: (1, 20, ("+",)),
    3: (1, 50, ("+", "-")),
    4: (1, 99, ("+", "-")),
    5: (2, 30, ("+", "-", "*")),
}
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
#: The curriculum never narrows the operands below 1..9 (difficulty 1's range).
CURRICULUM_MIN_OPERAND = 9
PROMPT = "What is {a} {op} {b}? Answer with just the number."


def is_heldout(a: int, op: str, b: int, fraction: float) -> bool:
    """Whether problem ``a op b`` belongs to the held-out (evaluation) split.

    A fixed multiplicative hash of the operands, independent of any seed, so train and eval
    never share a problem.

    Args:
        a: first operand.
        op: operator symbol.
        b: second operand.
        fraction: share of problems held out, in [0, 1).

    Returns:
        True for held-out problems.
    """
    h = (a * 1_000_003 + b * 7_919 + ord(op) * 104_729) * 2_654_435_761 % 2**32
    return h / 2**32 < fraction


def make_problem(rng: random.Random, difficulty: int, heldout: bool, fraction: float,
                 max_operand: int | None = None) -> dict[str, Any]:
    """Draw one problem of the requested split.

    Args:
        rng: random source.
        difficulty: key of :data:`DIFFICULTIES`.
        heldout: draw from the held-out split (True) or the training split (False).
        fraction: held-out share (see :func:`is_heldout`).
        max_operand: largest operand (the curriculum's target), within the difficulty's range
            and at least :data:`CURRICULUM_MIN_OPERAND`; None: the difficulty's own.

    Returns:
        ``{"a", "op", "b", "answer", "question"}``.

    Raises:
        ValueError: unknown difficulty.
    """
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {sorted(DIFFICULTIES)}, got {difficulty}")
    lo, hi, ops = DIFFICULTIES[difficulty]
    if max_operand is not None:
        hi = min(hi, max(max_operand, CURRICULUM_MIN_OPERAND, lo))
    while True:
        a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(ops)
        if op == "-" and b > a:
            a, b = b, a
        if is_heldout(a, op, b, fraction) == heldout:
            answer = _OPS[op](a, b)
            return {"a": a, "op": op, "b": b, "answer": answer,
                    "question": PROMPT.format(a=a, op=op, b=b)}


def problem_shape(a: int, op: str, b: int) -> str:
    """A problem's class: its operator, its operands' digit counts and its carries or borrows.

    For ``+`` the carries out of the units and the tens column, for ``-`` (``a >= b``, as
    :func:`make_problem` draws them) the borrows into them (below 100 only the units can
    borrow); ``*`` has no column flags. Difficulty 4 has 17 classes against about 11,000
    training problems, so each class recurs many times in a run: ``--env.difficulty_filter_by
    shape`` gives the item filter these classes as item ids.

    Args:
        a: first operand (>= 0).
        op: ``+``, ``-`` or ``*``.
        b: second operand (>= 0).

    Returns:
        E.g. ``"2+1 c10"`` (two digits plus one, a carry out of the units only) or
        ``"2-1 b10"`` (two digits minus one, a borrow into the units).
    """
    digits = f"{len(str(a))}{op}{len(str(b))}"
    if op == "+":
        units = (a % 10 + b % 10) >= 10
        tens = (a // 10 % 10 + b // 10 % 10 + units) >= 10
        return f"{digits} c{units:d}{tens:d}"
    if op == "-":
        units = a % 10 < b % 10
        tens = a // 10 % 10 - units < b // 10 % 10
        return f"{digits} b{units:d}{tens:d}"
    return digits


def column_carries(a: int, op: str, b: int) -> int:
    """Carries (``+``), borrows (``-``, ``a >= b``) or carrying digit products (``*``) of ``a op b``.

    For ``+`` the columns, units first, whose digit sum with the incoming carry reaches 10; for
    ``-`` the columns that borrow; for ``*`` the pairs of digits whose product reaches 10 (each
    one carries in the long multiplication's partial products). Operands are taken as their
    absolute values.
    """
    a, b = abs(a), abs(b)
    if op == "*":
        return sum(int(x) * int(y) >= 10 for x in str(a) for y in str(b))
    count, carry = 0, 0
    while a or b:
        x, y = a % 10, b % 10
        if op == "+":
            carry = int(x + y + carry >= 10)
        else:
            carry = int(x - carry < y)
        count += carry
        a, b = a // 10, b // 10
    return count


def problem_features(a: int, op: str, b: int) -> dict[str, float]:
    """What makes ``a op b`` hard, as the item filter's screen features (``item_features``).

    The operator (``op_add``, ``op_sub``, ``op_mul``: 1 for the problem's own), each operand's
    digit count and magnitude (``log10(1 + x)``), the carries or borrows
    (:func:`column_carries`), the answer's digit count and sign (``answer_negative``), whether
    the operands are equal, and the operands' zero digits (columns that need no work).

    Returns:
        ``{name: value}``, 13 features, all finite.
    """
    answer = _OPS[op](a, b)
    return {
        "op_add": float(op == "+"), "op_sub": float(op == "-"), "op_mul": float(op == "*"),
        "a_digits": float(len(str(abs(a)))), "b_digits": float(len(str(abs(b)))),
        "a_log10": math.log10(1 + abs(a)), "b_log10": math.log10(1 + abs(b)),
        "carries": float(column_carries(a, op, b)),
        "answer_digits": float(len(str(abs(answer)))), "answer_negative": float(answer < 0),
        "answer_log10": math.log10(1 + abs(answer)), "equal_operands": float(a == b),
        "zero_digits": float(str(abs(a)).count("0") + str(abs(b)).count("0")),
    }


def curriculum_update(target: float, mean_score: float, goal: float, step: float, low: float,
                      high: float, sharpness: float = 2.0) -> float:
    """The curriculum's next target difficulty after one group.

    AdaRFT's update (Shi et al. 2025, "Efficient Reinforcement Finetuning via Adaptive
    Curriculum Learning", arXiv:2504.05520, Algorithm 1): ``T <- T + eta * tanh(alpha * (R -
    beta))``, clipped to ``[low, high]``, with ``R`` the group's mean reward, ``beta`` the reward
    it aims for and ``alpha`` the sharpness. The paper updates once a batch; here once a group,
    with a step to match.

    Args:
        target: the current target (here the largest operand).
        mean_score: the group's mean score, in [0, 1].
        goal: ``beta``, the mean score to hold (0.5: the most groups with mixed scores).
        step: ``eta``, the most the target moves after one group (in operands, about 0.76 of it
            at a mean score of 0 or 1 with ``goal`` 0.5).
        low: the smallest target.
        high: the largest target.
        sharpness: ``alpha``.

    Returns:
        The new target, in ``[low, high]``.
    """
    return clip_target(target + step * math.tanh(sharpness * (mean_score - goal)), low, high)


def clip_target(target: float, low: float, high: float) -> float:
    """``target`` clipped to the curriculum's range ``[low, high]`` (operands)."""
    return min(high, max(low, float(target)))


def heldout_problems(difficulty: int, fraction: float, size: int, seed: int) -> list[dict[str, Any]]:
    """The evaluation set: up to ``size`` DISTINCT held-out problems in a seeded order.

    Args:
        difficulty: key of :data:`DIFFICULTIES`.
        fraction: held-out share (see :func:`is_heldout`).
        size: problems wanted (fewer when the held-out split is smaller).
        seed: shuffling seed.

    Returns:
        Problems as in :func:`make_problem`.

    Raises:
        ValueError: unknown difficulty.
    """
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {sorted(DIFFICULTIES)}, got {difficulty}")
    lo, hi, ops = DIFFICULTIES[difficulty]
    problems = [
        {"a": a, "op": op, "b": b, "answer": _OPS[op](a, b),
         "question": PROMPT.format(a=a, op=op, b=b)}
        for op in ops for a in range(lo, hi + 1) for b in range(lo, hi + 1)
        if not (op == "-" and b > a) and is_heldout(a, op, b, fraction)
    ]
    random.Random(seed).shuffle(problems)
    return problems[:size]


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def final_number(text: str) -> str | None:
    r"""The answer a reply commits to: the last number inside its last ``\boxed{}``, else its last number.

    Args:
        text: the assistant reply.

    Returns:
        The number as written (e.g. ``"-12"``), or None when the reply holds no number.
    """
    boxed = _BOXED.findall(text)
    numbers = _NUMBER.findall(boxed[-1] if boxed else text)
    if not numbers and boxed:
        numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def score_reply(text: str, answer: int, finish_reason: str | None) -> float:
    """1.0 when the reply stopped by itself and its final number equals ``answer``, else 0.0.

    The final number is extracted and compared with math-verify (``parse`` / ``verify``).

    Args:
        text: the assistant reply.
        answer: the true result.
        finish_reason: the sampler's finish reason ("stop" or "length").

    Returns:
        1.0 or 0.0.
    """
    if finish_reason == "length":
        return 0.0
    from math_verify import parse, verify

    # math-verify's timeouts use signal.alarm, which only works in the main thread.
    kw: dict[str, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        kw = {"parsing_timeout": None}
    # Score only the reply's final number (boxed content wins). Parsing the whole reply would let
    # math-verify evaluate an echoed question: "7 + 5" or "7 + 5 = x" would then score as 12.
    final = final_number(text)
    if final is None:
        return 0.0
    predicted = parse(final, **kw)
    if not predicted:
        return 0.0
    gold = parse(str(answer), **kw)
    vkw = {"timeout_seconds": None} if kw else {}
    return 1.0 if verify(gold, predicted, **vkw) else 0.0


def digit_credit(final: str | None, answer: int) -> float:
    """The share of the answer's digits a wrong final number gets right, place by place.

    The two numbers are aligned at the ones place and compared digit by digit (ones with ones,
    tens with tens); the share is the matching places over the longer number's digit count. A
    number of the wrong sign, a non-integer or no number at all gets 0. For 57: 47 -> 0.5,
    157 -> 2/3 (three places, two match), 75 -> 0, -57 -> 0, 57 -> 1.

    Args:
        final: the reply's final number as written (:func:`final_number`), or None.
        answer: the true result.

    Returns:
        A share in [0, 1].
    """
    if final is None or not re.fullmatch(r"-?\d+", final):
        return 0.0
    predicted = int(final)
    if (predicted < 0) != (answer < 0):
        return 0.0
    said, true = str(abs(predicted))[::-1], str(abs(answer))[::-1]
    matches = sum(a == b for a, b in zip(said, true, strict=False))
    return matches / max(len(said), len(true))


class ArithmeticEnvConfig(SingleTurnEnvConfig):
    """Settings of :class:`ArithmeticEnv`."""

    difficulty: int = Field(default=2, ge=1, le=max(DIFFICULTIES),
                            description="1: a+b with 1..9; 2: 1..20; 3: +,- with 1..50; "
                            "4: +,- with 1..99; 5: +,-,* with 2..30.")
    max_tokens: int = Field(default=24, ge=1, description="Completion budget per rollout; "
                            "a reply cut off by it scores 0.")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature for training rollouts.")
    seed: int = Field(default=0, description="Seed of the training-problem generator.")
    eval_size: int = Field(default=100, ge=1, description="Distinct held-out problems in the evaluation "
                           "set (all of them when the split is smaller).")
    eval_seed: int = Field(default=1234, description="Seed of the evaluation-set generator.")
    eval_temperature: float = Field(default=0.0, ge=0, description="Evaluation temperature (0 = greedy).")
    heldout_fraction: float = Field(default=0.25, gt=0, lt=1,
                                    description="Share of operand pairs reserved for evaluation.")
    max_token_length: int = Field(default=256, ge=1, description="Longest sequence, in tokens.")
    steps_per_eval: int = Field(default=10_000, description="Evaluate every this many trainer "
                                "steps in serve mode (the quickstart evaluates from the trainer).")
    curriculum: bool = Field(default=False, description="Adapt the training problems' largest "
                             "operand to the policy (AdaRFT, arXiv:2504.05520): it rises while "
                             "groups solve more than curriculum_target of their replies and falls "
                             "while they solve less. Evaluation keeps the whole range. Off by default: "
                             "on difficulty 4 it did not lower the dropped share and learned less "
                             "(docs: Benchmarks).")
    difficulty_filter_by: Literal["problem", "shape"] = Field(
        default="problem", description="What the item filter (--env.item_filter.*) keeps a record of: "
        "'problem' (each distinct problem; at difficulty 4 few recur within a run) or 'shape' "
        "(the operator, the operands' digit counts and the carries or borrows: 17 classes at "
        "difficulty 4, that recur all the time).")
    partial_credit: float = Field(default=0.0, ge=0, lt=1, description="The most a wrong "
                                  "reply that stopped by itself scores: this times the share of "
                                  "the answer's digits it gets right, place by place (57: 47 gets "
                                  "half). It gives groups whose replies all fail a reward that still "
                                  "ranks them, so fewer groups are dropped as all-same. 0 = "
                                  "exact-match rewards only. Accuracy (eval/accuracy, "
                                  "train/percent_correct) still counts only rewards of 1.")
    curriculum_start: int = Field(default=20, ge=CURRICULUM_MIN_OPERAND,
                                  description="The curriculum's first largest operand.")
    curriculum_target: float = Field(default=0.5, gt=0, lt=1, description="The share of a "
                                     "group's replies the curriculum aims to have solved.")
    curriculum_step: float = Field(default=0.5, gt=0, description="The most the largest operand "
                                   "moves after one group (in operands).")


class ArithmeticEnv(SingleTurnEnv):
    """Arithmetic questions; reward 1 for the right number in a reply that stops by itself.

    ``evaluate`` reports ``eval/accuracy`` on the held-out problems (greedy by default).
    """

    name = "arithmetic"
    env_config_cls = ArithmeticEnvConfig
    truncated_reward = 0.0  # a reply cut off by max_tokens scores 0
    send_messages = False  # token-only groups unless --env.include_messages
    #: The curriculum's largest operand (None: off, the difficulty's whole range); set in setup.
    max_operand: float | None = None

    async def setup(self) -> None:
        """Build the fixed held-out evaluation set (training problems come from ``self.rng``)."""
        cfg = self.config
        self.eval_items = heldout_problems(cfg.difficulty, cfg.heldout_fraction, cfg.eval_size,
                                           cfg.eval_seed)
        high = DIFFICULTIES[cfg.difficulty][1]
        self.max_operand = min(cfg.curriculum_start, high) if cfg.curriculum else None

    def item_id(self, item: dict[str, Any]) -> str:
        """The item filter's id of a problem: the problem, or its :func:`problem_shape`."""
        if self.config.difficulty_filter_by == "shape":
            return problem_shape(item["a"], item["op"], item["b"])
        return f"{item['a']}{item['op']}{item['b']}"

    def item_features(self, item: dict[str, Any]) -> dict[str, float]:
        """:func:`problem_features` of a problem, for ``--env.item_filter.screen_signal features``."""
        return problem_features(item["a"], item["op"], item["b"])

    def train_item(self, index: int) -> dict[str, Any]:
        """A fresh training-split problem (operands up to the curriculum's target when it is on)."""
        cfg = self.config
        target = self.max_operand
        return make_problem(self.rng, cfg.difficulty, False, cfg.heldout_fraction,
                            None if target is None else round(target))

    def finish_group(self, item: dict[str, Any], group: Any) -> Any:
        """Move the curriculum's target by the group's mean score (every group, also all-same ones)."""
        target = self.max_operand
        if target is not None and group["scores"]:
            cfg = self.config
            mean = sum(group["scores"]) / len(group["scores"])
            self.max_operand = curriculum_update(
                target, mean, cfg.curriculum_target, cfg.curriculum_step,
                low=CURRICULUM_MIN_OPERAND, high=DIFFICULTIES[cfg.difficulty][1])
        return group

    def save_checkpoint(self, step: int, data: dict[str, Any] | None = None) -> None:
        """Save the curriculum's target too, so a restarted env resumes it (see :meth:`load_checkpoint`)."""
        extra = {} if self.max_operand is None else {"max_operand": self.max_operand}
        super().save_checkpoint(step, {**extra, **(data or {})})

    def load_checkpoint(self) -> None:
        """Restore the cursor and the curriculum's target, kept within this config's bounds.

        A saved target is ignored when the curriculum is now off; with the curriculum now on and
        no saved target, the target stays at ``curriculum_start``.
        """
        super().load_checkpoint()
        cfg = self.config
        if not cfg.curriculum:
            self.max_operand = None
        elif self.max_operand is not None:
            self.max_operand = clip_target(self.max_operand, CURRICULUM_MIN_OPERAND,
                                           DIFFICULTIES[cfg.difficulty][1])

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        """Add ``train/curriculum_max_operand`` when the curriculum is on."""
        metrics = dict(metrics or {})
        if self.max_operand is not None:
            metrics["train/curriculum_max_operand"] = float(self.max_operand)
        await super().wandb_log(metrics)

    @staticmethod
    def messages(item: dict[str, Any]) -> list[dict[str, str]]:
        """The chat prompt of a problem (the model's default system prompt is kept)."""
        return [{"role": "user", "content": item["question"]}]

    def prompt(self, item: dict[str, Any]) -> list[dict[str, str]]:
        """See :meth:`messages`."""
        return self.messages(item)

    def score(self, item: dict[str, Any], completion: str) -> float:
        """:func:`score_reply` of a reply that stopped by itself.

        With ``partial_credit`` set, a wrong reply scores ``partial_credit`` times its
        :func:`digit_credit` instead of 0.
        """
        reward = score_reply(completion, item["answer"], "stop")
        credit = self.config.partial_credit
        if reward < 1.0 and credit > 0:
            reward = credit * digit_credit(final_number(completion), item["answer"])
        return reward

    def answer(self, item: dict[str, Any]) -> int:
        """The true result."""
        return item["answer"]

    def reference_reply(self, item: dict[str, Any]) -> tuple[str, str]:
        """``("57 + 12 =", " 69")``: the working the way trained policies write it, then the result.

        The item filter's screen (``--env.item_filter.screen``) scores the result's
        tokens after the working. Measured on a policy trained at difficulty 4 (it replies
        ``"57 + 12 = 69"``): with the bare result as the reference reply the signal did not
        predict a group's solve rate at all, and with this one it did.
        """
        return f"{item['a']} {item['op']} {item['b']} =", f" {item['answer']}"


if __name__ == "__main__":
    ArithmeticEnv.cli()
