"""Hermes-style tool-call parsing."""

from __future__ import annotations

import json

from atroposlib.utils.tool_call_parser import parse_tool_calls


def test_parses_calls_and_keeps_other_text():
    text = ('Let me check.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call>\n<tool_call>{"name": "time", "arguments": "{}"}</tool_call>')
    content, calls = parse_tool_calls(text)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["weather", "time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert calls[1]["function"]["arguments"] == "{}"
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)


def test_invalid_blocks_stay_text():
    text = "<tool_call>not json</tool_call> and <tool_call>[1, 2]</tool_call>"
    assert parse_tool_calls(text) == (text, [])
    assert parse_tool_calls("plain answer") == ("plain answer", [])
    assert parse_tool_calls('<tool_call>{"name": "f"}</tool_call>')[0] is None
