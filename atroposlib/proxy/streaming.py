"""Server-sent events for ``stream=true`` chat completions: a whole response as OpenAI chunks.

The proxy tracks whole responses only (every token of a choice is recorded once it is
sampled), so a streamed request is generated whole and then sent as the chunk sequence an
OpenAI server would have streamed: one ``chat.completion.chunk`` per choice carrying its
complete ``delta`` (role, content, tool calls with their ``index``) and ``finish_reason``,
then, when ``stream_options.include_usage`` is set, a chunk with no choices and the
``usage``, then ``data: [DONE]``. Clients that always stream (agent harnesses built on the
OpenAI SDK's streaming helpers) get the same answer as a non-streamed request.
"""

from __future__ import annotations

from typing import Any

import orjson


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _delta(message: dict[str, Any]) -> dict[str, Any]:
    """The one delta that carries a whole assistant message (tool calls indexed)."""
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    calls = message.get("tool_calls") or []
    if calls:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
    return delta


def chat_completion_events(completion: dict[str, Any], include_usage: bool) -> bytes:
    r"""Encode a whole chat completion as the SSE body of a streamed one.

    Args:
        completion: the ``ChatCompletion`` as JSON (``model_dump(mode="json")``).
        include_usage: send the ``usage`` chunk (OpenAI's ``stream_options.include_usage``);
            ``usage`` is sent as null when the completion has none.

    Returns:
        The ``text/event-stream`` body: ``data: {chunk}\n\n`` per chunk, then
        ``data: [DONE]\n\n``.
    """
    base = {
        "id": completion.get("id"),
        "object": "chat.completion.chunk",
        "created": completion.get("created"),
        "model": completion.get("model"),
    }
    out = []
    for choice in completion.get("choices") or []:
        out.append(_event({**base, "choices": [{
            "index": choice.get("index", 0),
            "delta": _delta(choice.get("message") or {}),
            "logprobs": None,
            "finish_reason": choice.get("finish_reason") or "stop",
        }]}))
    if include_usage:
        out.append(_event({**base, "choices": [], "usage": completion.get("usage")}))
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


__all__ = ["chat_completion_events"]
