"""Multi-turn tool use: arithmetic word problems solved with a calculator tool the model calls."""

from __future__ import annotations

import ast
import operator
import random
import re
from fractions import Fraction
from typing import Any

from pydantic import Field

from atroposlib.envs.multi_turn import MultiTurnEnv, MultiTurnEnvConfig
from atroposlib.envs.scoring import extract_answer_tag, extract_tool_calls

SYSTEM_PROMPT = (
    "You solve arithmetic problems exactly. You have a calculator tool:\n"
    '<tool_call>{"name": "calculator", "arguments": {"expression": "12*(3+4)"}}</tool_call>\n'
    "Call it (one call per reply) whenever you need to compute; its result comes back in the "
    "next message. When you know the result, reply with only <answer>NUMBER</answer>."
)

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
        ast.Pow: operator.pow}


def calculate(expression: str, max_length: int = 200) -> Fraction:
    """Evaluate ``+ - * / // % **`` and parentheses over numbers exactly (no ``eval``).

    Args:
        expression: e.g. ``"347*29 + 1200/16"``; ``x`` and ``^`` are read as ``*`` and ``**``.
        max_length: longest expression accepted.

    Returns:
        The exact value.

    Raises:
        ValueError: anything else (names, calls, huge powers, division by zero), with a
            message meant for the model.
    """
    expression = expression.strip().replace("^", "**").replace("×", "*").replace("x", "*")
    if len(expression) > max_length:
        raise ValueError(f"expression longer than {max_length} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot parse {expression!r}") from exc

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow):
                if right.denominator != 1 or abs(right) > 64 or abs(left) > 10**6:
                    raise ValueError("power too large (integer exponents up to 64 only)")
                return left ** int(right)
            if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
                raise ValueError("division by zero")
            return Fraction(_OPS[type(node.op)](left, right))
        raise ValueError(f"unsupported syntax {type(node).__name__}; use numbers and + - * / ( )")

    return walk(tree)


def format_number(value: Fraction) -> str:
    """An integer as is, otherwise a decimal rounded to 6 places."""
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"


def make_problem(rng: random.Random) -> dict[str, Any]:
    """A problem whose exact answer is an integer: ``{"question", "expression", "answer"}``."""
    a, b, c = rng.randint(12, 999), rng.randint(12, 99), rng.randint(100, 9999)
    kind = rng.randrange(3)
    if kind == 0:
        expr, text = f"{a} * {b} + {c}", f"A shop sells {a} boxes of {b} pens and has {c} loose pens. How many pens in total?"
    elif kind == 1:
        d = rng.randint(2, 30)
        expr, text = (f"({a} + {c}) * {d} - {b}",
                      f"Two warehouses hold {a} and {c} crates. Each crate weighs {d} kg; {b} kg are "
                      "lost. How many kg remain?")
    else:
        d = rng.randint(2, 12)
        expr, text = (f"{a * d} * {b} / {d}",
                      f"{a * d} workers each make {b} parts, shared equally among {d} teams. "
                      "How many parts does each team get?")
    return {"question": text, "expression": expr, "answer": int(calculate(expr))}


def final_answer(text: str) -> Fraction | None:
    """The number in the reply's ``<answer>`` (or last boxed expression), or None."""
    raw = extract_answer_tag(text)
    if raw is None:
        boxed = re.findall(r"\\boxed\{([^}]*)\}", text)
        raw = boxed[-1] if boxed else None
    if raw is None:
        return None
    try:
        return Fraction(raw.replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


class CalculatorConfig(MultiTurnEnvConfig):
    """Settings of :class:`CalculatorEnv`."""

    max_turns: int = Field(default=4, ge=1, description="Assistant turns (tool calls + answer).")
    max_tokens: int = Field(default=96, ge=1, description="Tokens per assistant turn.")
    tool_role: str = Field(
        default="tool",
        description="Role of the tool-result messages ('tool', or 'user' for chat templates "
        "without a tool role).",
    )
    tool_use_bonus: float = Field(
        default=0.0, description="Added to the score of a correct answer that used the tool."
    )
    seed: int = Field(default=0, description="Seed of the problem generator.")
    eval_size: int = Field(default=30, ge=1, description="Greedy problems in evaluate.")


class CalculatorEnv(MultiTurnEnv):
    """Calculator tool loop; score +1 for the exact final answer, -1 otherwise.

    Metrics (``train/`` and ``eval/``): ``correct``, ``tool_calls``, ``tool_errors`` and
    ``answered`` per episode.
    """

    name = "calculator"
    env_config_cls = CalculatorConfig

    async def setup(self) -> None:
        eval_rng = random.Random(self.config.seed + 1_000_003)
        self.eval_items = [make_problem(eval_rng) for _ in range(self.config.eval_size)]

    def train_item(self, index: int) -> dict[str, Any]:
        """A fresh problem from the seeded generator ``self.rng``."""
        return make_problem(self.rng)

    async def play_episode(self, item, *, temperature: float, split: str):
        return await self.solve(item, temperature=temperature, split=split)

    async def solve(self, item, *, temperature: float, split: str = "train"):
        """Run one tool-using episode; return ``(Episode, score, stats)``."""
        state = {"tool_calls": 0, "tool_errors": 0, "answer": None}

        def on_reply(text: str, _turn: int):
            calls, malformed = extract_tool_calls(text)
            if not calls and not malformed:
                state["answer"] = final_answer(text)
                return None  # a reply without a tool call is the final answer
            if malformed or len(calls) != 1 or calls[0]["name"] != "calculator":
                state["tool_errors"] += 1
                result = ("error: make exactly one call "
                          '{"name": "calculator", "arguments": {"expression": "..."}}')
            else:
                state["tool_calls"] += 1
                try:
                    result = format_number(calculate(str(calls[0]["arguments"].get("expression", ""))))
                except ValueError as exc:
                    state["tool_errors"] += 1
                    result = f"error: {exc}"
            return [{"role": self.config.tool_role, "content": result}]

        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": item["question"]}]
        episode = await self.converse(messages, on_reply, temperature=temperature, split=split)
        correct = state["answer"] is not None and state["answer"] == item["answer"]
        score = self.score_episode(item, episode.messages)
        stats = {"correct": float(correct), "tool_calls": float(state["tool_calls"]),
                 "tool_errors": float(state["tool_errors"]), "answered": float(state["answer"] is not None)}
        return episode, score, stats

    def score_episode(self, item: dict[str, Any], messages: list[dict[str, Any]]) -> float:
        """An episode's reward from its transcript: 1 for the exact answer, else -1.

        The answer is the number in the assistant reply that made no tool call (the one that
        ended the episode); a correct answer after at least one well-formed calculator call
        also gets ``tool_use_bonus``. ``play_episode`` scores with it, so
        ``atropos-replay rescore`` gives the same reward from a recorded transcript.

        Args:
            item: the problem (``{"answer": int, ...}``).
            messages: the conversation (system, user, assistant and tool turns).
        """
        answer, tool_calls = None, 0
        for message in messages:
            if message.get("role") != "assistant":
                continue
            text = str(message.get("content") or "")
            calls, malformed = extract_tool_calls(text)
            if not calls and not malformed:
                answer = final_answer(text)
            elif not malformed and len(calls) == 1 and calls[0]["name"] == "calculator":
                tool_calls += 1
        correct = answer is not None and answer == item["answer"]
        score = 1.0 if correct else -1.0
        return score + self.config.tool_use_bonus if correct and tool_calls else score


if __name__ == "__main__":
    CalculatorEnv.cli()
