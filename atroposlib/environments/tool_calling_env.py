"""Function calling: answer a request with the right ``<tool_call>`` JSON for the given tools."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

from pydantic import Field

from atroposlib.envs.data import load_rows, maybe_json
from atroposlib.envs.scoring import extract_tool_calls
from atroposlib.envs.single_turn import SingleTurnEnv, SingleTurnEnvConfig

SYSTEM_TEMPLATE = (
    "You are a function-calling assistant. You may call these tools:\n<tools>\n{tools}\n</tools>\n"
    "Answer the user's request ONLY with the tool call(s) it needs, one per block:\n"
    '<tool_call>{{"name": "tool_name", "arguments": {{"arg": "value"}}}}</tool_call>'
)

# ---------------------------------------------------------------- built-in offline task set
_TOOLS = {
    "get_weather": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"]},
    },
    "convert_currency": {
        "name": "convert_currency",
        "description": "Convert an amount between currencies (ISO codes).",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number"}, "from_currency": {"type": "string"},
            "to_currency": {"type": "string"}},
            "required": ["amount", "from_currency", "to_currency"]},
    },
    "set_timer": {
        "name": "set_timer",
        "description": "Start a countdown timer.",
        "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}},
                       "required": ["minutes"]},
    },
}
_CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Denver", "Hanoi", "Perth"]
_CURRENCIES = ["USD", "EUR", "JPY", "GBP", "CHF", "CAD"]


def builtin_example(rng: random.Random) -> dict[str, Any]:
    """A procedurally generated request in the xLAM schema (``query``, ``tools``, ``answers``)."""
    kind = rng.choice(["weather", "currency", "timer", "two"])
    if kind in ("weather", "two"):
        city, unit = rng.choice(_CITIES), rng.choice(["celsius", "fahrenheit"])
        calls = [{"name": "get_weather", "arguments": {"city": city, "unit": unit}}]
        query = f"What's the weather in {city} right now, in {unit}?"
        if kind == "two":
            minutes = rng.randint(2, 90)
            calls.append({"name": "set_timer", "arguments": {"minutes": minutes}})
            query = f"Check the weather in {city} in {unit} and set a {minutes} minute timer."
    elif kind == "currency":
        amount = rng.choice([5, 20, 75, 120, 1000])
        src, dst = rng.sample(_CURRENCIES, 2)
        calls = [{"name": "convert_currency",
                  "arguments": {"amount": amount, "from_currency": src, "to_currency": dst}}]
        query = f"How much is {amount} {src} in {dst}?"
    else:
        minutes = rng.randint(1, 120)
        calls = [{"name": "set_timer", "arguments": {"minutes": minutes}}]
        query = f"Set a timer for {minutes} minutes, please."
    return {"query": query, "tools": list(_TOOLS.values()), "answers": calls}


# ---------------------------------------------------------------- scoring
def _canonical(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return value


def _key(call: dict[str, Any]) -> str:
    return json.dumps({"name": call["name"], "arguments": _canonical(call["arguments"])},
                      sort_keys=True)


def calls_match(predicted: list[dict[str, Any]], expected: list[dict[str, Any]]) -> bool:
    """Same multiset of calls (name + arguments; order-free; ``1`` equals ``1.0``)."""
    return Counter(map(_key, predicted)) == Counter(map(_key, expected))


def score_tool_calls(text: str, expected: list[dict[str, Any]]) -> float:
    """+1.0 when the reply's tool calls equal the expected ones exactly, else -1.0."""
    calls, malformed = extract_tool_calls(text)
    return 1.0 if not malformed and calls_match(calls, expected) else -1.0


class ToolCallingConfig(SingleTurnEnvConfig):
    """Settings of :class:`ToolCallingEnv`."""

    dataset_name: str = Field(
        default="Salesforce/xlam-function-calling-60k",
        description="Hub id or local file with fields query, tools, answers (xLAM schema; "
        "tools/answers may be JSON strings), or 'builtin' for generated offline tasks.",
    )
    dataset_config: str | None = Field(default=None, description="Hub dataset configuration.")
    split: str = Field(default="train", description="Split to read.")
    eval_fraction: float = Field(
        default=0.05, gt=0, lt=1, description="Rows held out (seeded) for evaluate."
    )
    eval_limit: int = Field(default=100, ge=1, description="Evaluate on at most this many rows.")
    limit: int | None = Field(default=None, description="Read at most this many rows.")
    builtin_size: int = Field(default=500, ge=10, description="Rows generated for 'builtin'.")
    seed: int = Field(default=42, description="Shuffle/generation seed.")
    max_token_length: int = Field(default=2048, ge=1, description="Longest sequence, in tokens.")


class ToolCallingEnv(SingleTurnEnv):
    """Single-turn tool calling scored against the reference calls (+1 exact, -1 otherwise)."""

    name = "tool_calling"
    env_config_cls = ToolCallingConfig

    @staticmethod
    def _item(row: dict[str, Any]) -> dict[str, Any]:
        for field in ("query", "tools", "answers"):
            if field not in row:
                raise KeyError(f"row has no {field!r} (fields: {sorted(row)}); the tool-calling "
                               "env reads the xLAM schema: query, tools, answers")
        answers = maybe_json(row["answers"])
        if isinstance(answers, dict):
            answers = [answers]
        for call in answers:
            call["arguments"] = maybe_json(call.get("arguments", {}))
        return {"query": str(row["query"]), "tools": maybe_json(row["tools"]), "answers": answers}

    async def setup(self) -> None:
        c = self.config
        rng = random.Random(c.seed)
        if c.dataset_name == "builtin":
            rows = [builtin_example(rng) for _ in range(c.builtin_size)]
        else:
            rows = load_rows(c.dataset_name, c.split, c.dataset_config, c.limit)
        items = [self._item(r) for r in rows]
        rng.shuffle(items)
        n_eval = min(c.eval_limit, max(1, int(len(items) * c.eval_fraction)))
        if len(items) < 2:
            raise ValueError("the tool-calling dataset needs at least 2 rows (train + eval)")
        self.eval_items = items[:n_eval]
        # the same request in both splits would measure recall, not skill (the builtin
        # generator repeats requests: 500 rows hold about 300 distinct ones)
        held_out = {i["query"] for i in self.eval_items}
        self.train_items = [i for i in items[n_eval:] if i["query"] not in held_out]
        if not self.train_items:
            raise ValueError("every training row repeats an eval row's query; use more rows "
                             "or a smaller eval_fraction")

    def prompt(self, item):
        tools = "\n".join(json.dumps(t) for t in item["tools"])
        return [{"role": "system", "content": SYSTEM_TEMPLATE.format(tools=tools)},
                {"role": "user", "content": item["query"]}]

    def score(self, item, completion: str) -> float:
        """:func:`score_tool_calls`: +1.0 for exactly the reference calls, else -1.0."""
        return score_tool_calls(completion, item["answers"])

    def answer(self, item):
        return item["answers"]


if __name__ == "__main__":
    ToolCallingEnv.cli()
