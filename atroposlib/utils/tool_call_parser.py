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


def extract_tool_call(text: str, preferred_tags: list[str] | None = None) -> str | None:
    """The stripped content of the first ``<tag>...</tag>`` block, trying ``preferred_tags`` in order.

    Args:
        text: model output.
        preferred_tags: tag names to look for (default ``["tool_call"]``).

    Returns:
        The block's content, or None when no tag is found.
    """
    for tag in preferred_tags or ["tool_call"]:
        match = re.search(f"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL)
        if match:
            return match.group(1).strip()
    return None


#: Tool name returned by :func:`parse_tool_call` when no valid call was found.
TOOL_CALL_ERROR = "-ERROR-"


def parse_tool_call(
    response: str,
    available_tools: list[dict[str, Any]] | None = None,
    preferred_tags: list[str] | None = None,
) -> tuple[str, dict[str, Any], bool]:
    """Parse the first tool call of a response (the single-call helper envs use for scoring).

    The block must hold a JSON object with a string ``name`` and an object ``arguments``
    (``parameters`` is accepted too). With ``available_tools`` (OpenAI tool schemas or bare
    ``{"name": ...}`` dicts) the name must be one of them.

    Args:
        response: model output.
        available_tools: the tools the model may call, or None to accept any name.
        preferred_tags: tag names to look for (default ``["tool_call"]``).

    Returns:
        ``(tool_name, arguments, is_error)``; on any problem ``("-ERROR-", {}, True)``.
    """
    content = extract_tool_call(response, preferred_tags)
    if content is None:
        return TOOL_CALL_ERROR, {}, True
    try:
        payload = json.loads(content)
    except json.JSONDecodeError:
        return TOOL_CALL_ERROR, {}, True
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return TOOL_CALL_ERROR, {}, True
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return TOOL_CALL_ERROR, {}, True
    if not isinstance(arguments, dict):
        return TOOL_CALL_ERROR, {}, True
    if available_tools is not None:
        names = {(t.get("function") or t).get("name") for t in available_tools if isinstance(t, dict)}
        if payload["name"] not in names:
            return TOOL_CALL_ERROR, {}, True
    return payload["name"], arguments, False


__all__ = ["TOOL_CALL_ERROR", "extract_tool_call", "parse_tool_call", "parse_tool_calls"]
