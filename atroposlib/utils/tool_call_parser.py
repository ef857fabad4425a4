"""Parse Hermes-style ``<tool_call>{json}</tool_call>`` blocks out of model text into OpenAI tool calls."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split ``text`` into plain content and OpenAI-format tool calls.

    Each ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block becomes
    ``{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}``. Blocks that
    are not valid JSON objects with a string ``name`` are left in the content untouched.

    Args:
        text: the decoded completion.

    Returns:
        ``(content or None when only tool calls remain, tool_calls)``.
    """
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in _TOOL_CALL.finditer(text):
        try:
            payload = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            continue
        arguments = payload.get("arguments", payload.get("parameters", {}))
        calls.append({
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {
                "name": payload["name"],
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
            },
        })
        kept.append(text[last:match.start()])
        last = match.end()
    kept.append(text[last:])
    content = "".join(kept).strip() if calls else text
    return (content or None), calls


__all__ = ["parse_tool_calls"]
