"""Scoring replies: find the answer or tool calls in a reply, resolve score hooks, average details."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def extract_answer_tag(text: str) -> str | None:
    """The content of the LAST ``<answer>...</answer>`` in ``text`` (stripped), or None."""
    found = _ANSWER_TAG.findall(text)
    return found[-1].strip() if found else None


_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL | re.IGNORECASE)


def extract_tool_calls(text: str) -> tuple[list[dict[str, Any]], int]:
    """Parse every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in ``text``.

    ``arguments`` may also be a JSON string (OpenAI style); it is decoded.

    Returns:
        ``(calls, malformed)``: the well-formed calls as ``{"name", "arguments"}`` dicts, and
        how many blocks were not valid JSON objects with a string ``name`` and dict arguments.
    """
    calls, malformed = [], 0
    for raw in _TOOL_CALL.findall(text):
        try:
            call = json.loads(raw.strip())
            args = call.get("arguments", call.get("parameters", {}))
            args = json.loads(args) if isinstance(args, str) else args
        except (json.JSONDecodeError, AttributeError):
            malformed += 1
            continue
        if not isinstance(call.get("name"), str) or not isinstance(args, dict):
            malformed += 1
            continue
        calls.append({"name": call["name"], "arguments": args})
    return calls, malformed


#: What a score hook returns: a reward, or ``(reward, details)`` (details: name -> value,
#: numbers averaged into metrics, anything JSON-able kept in eval samples); maybe awaitable.
ScoreResult = float | tuple[float, Mapping[str, Any]]


async def resolve_score(value: Any) -> tuple[float, dict[str, Any]]:
    """``(reward, details)`` of a score hook's result (awaited first when it is awaitable).

    Accepts a number or ``(number, mapping)``; the number is returned as a float.

    Raises:
        TypeError: the result is neither; the message shows what came back.
    """
    import inspect

    if inspect.isawaitable(value):
        value = await value
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], Mapping):
        value, details = value
    else:
        details = {}
    try:
        return float(value), dict(details)
    except (TypeError, ValueError):
        raise TypeError(
            f"a score must be a number or (number, dict of details), got {value!r}"
        ) from None


def mean_details(details: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, float]:
    """``{f"{prefix}/{key}": mean}`` of every numeric (or bool) detail, over the rows that have it."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for row in details:
        for key, value in row.items():
            if isinstance(value, int | float):
                sums[key] = sums.get(key, 0.0) + float(value)
                counts[key] = counts.get(key, 0) + 1
    return {f"{prefix}/{key}": sums[key] / counts[key] for key in sums}


__all__ = ["ScoreResult", "extract_answer_tag", "extract_tool_calls", "mean_details", "resolve_score"]
