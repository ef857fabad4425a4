"""``ToolCallTranslator``: model text <-> OpenAI ``tool_calls``, with vLLM's tool parsers.

Outbound, ``parse_model_output`` runs one of vLLM's registered tool parsers (``"hermes"``,
``"llama3_json"``, ...) over a completion and returns OpenAI tool calls. Each call id is
remembered with the exact raw text it came from, so that when a client later sends the
conversation back (an assistant message with ``tool_calls``), ``convert_messages_for_template``
puts the *same* raw text back into the chat template and the re-rendered prompt matches the
tokens that were actually sampled (multi-turn token tracking depends on that).

vLLM is imported only when a translator is created; ``VLLM_AVAILABLE`` (resolved on first
access) says whether its tool parsers can be imported.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

logger = logging.getLogger(__name__)

_AVAILABLE: bool | None = None


def _vllm_available() -> bool:
    global _AVAILABLE
    if _AVAILABLE is None:
        try:
            from vllm.entrypoints.openai.chat_completion.protocol import (  # noqa: F401
                ChatCompletionRequest,
            )
            from vllm.tool_parsers.abstract_tool_parser import ToolParserManager  # noqa: F401

            _AVAILABLE = True
        except Exception as exc:  # noqa: BLE001 - any import failure means "not usable"
            logger.debug("vLLM tool parsers unavailable: %r", exc)
            _AVAILABLE = False
    return _AVAILABLE


#: vLLM protocol/parser classes Atropos 0.4 re-exported from here -> the vLLM modules that hold
#: them, newest layout first (vLLM moves them between releases).
_PROTOCOL_HOMES = (
    "vllm.entrypoints.openai.engine.protocol",
    "vllm.entrypoints.generate.base.protocol",
    "vllm.entrypoints.openai.protocol",
)
_VLLM_NAMES = {
    "ChatCompletionRequest": ("vllm.entrypoints.openai.chat_completion.protocol",
                              "vllm.entrypoints.openai.protocol"),
    "ExtractedToolCallInformation": _PROTOCOL_HOMES,
    "FunctionCall": _PROTOCOL_HOMES,
    "ToolCall": _PROTOCOL_HOMES,
    "ToolParser": ("vllm.tool_parsers.abstract_tool_parser",),
    "ToolParserManager": ("vllm.tool_parsers.abstract_tool_parser",),
}


def _vllm_class(name: str) -> Any:
    """VLLM's class ``name`` from the first of its homes that has it, or None."""
    import importlib

    if not _vllm_available():
        return None
    for home in _VLLM_NAMES[name]:
        try:
            return getattr(importlib.import_module(home), name)
        except (ImportError, AttributeError):
            continue
    return None


def __getattr__(name: str) -> Any:
    """``VLLM_AVAILABLE`` and vLLM's tool-parser classes, resolved on first access.

    The vLLM names are None when vLLM (or that class) cannot be imported, as in Atropos 0.4.
    """
    if name == "VLLM_AVAILABLE":
        return _vllm_available()
    if name in _VLLM_NAMES:
        value = _vllm_class(name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ToolCallTranslator:
    """Translate between a model's raw tool-call text and OpenAI ``tool_calls`` (see module docstring).

    Example::

        translator = ToolCallTranslator(tokenizer, parser_name="hermes")
        content, tool_calls, finish_reason = translator.parse_model_output(text, "auto", tools)
        messages = translator.convert_messages_for_template(openai_messages)
    """

    def __init__(self, tokenizer: Any, parser_name: str = "hermes"):
        """Create a translator.

        Args:
            tokenizer: the served model's tokenizer (vLLM parsers read its vocabulary).
            parser_name: a vLLM tool parser name (``vllm serve --tool-call-parser`` values).

        Raises:
            ImportError: vLLM (with its tool parsers) is not installed.
            KeyError: vLLM has no tool parser called ``parser_name``.
        """
        if not _vllm_available():
            raise ImportError(
                "ToolCallTranslator needs vLLM's tool parsers: pip install vllm "
                "(or leave tool_parser unset to return raw text)"
            )
        from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

        self.tokenizer = tokenizer
        self.parser_name = parser_name
        self.parser = ToolParserManager.get_tool_parser(parser_name)(tokenizer)
        #: tool call id -> the raw text the call was parsed from
        self.call_id_to_raw_text: dict[str, str] = {}

    # ------------------------------------------------------------------ outbound
    def parse_model_output(
        self, raw_text: str, tool_choice: Any = None, tools: list[dict[str, Any]] | None = None
    ) -> tuple[str | None, list[Any] | None, str]:
        """Parse tool calls out of a completion.

        Nothing is parsed when ``tools`` is empty or ``tool_choice == "none"``, and a parser
        failure (e.g. invalid JSON inside the tags) falls back to plain text.

        Args:
            raw_text: the decoded completion (special tokens kept).
            tool_choice: the request's ``tool_choice`` (``"auto"``, ``"none"``, ``"required"``, a dict).
            tools: the request's tool schemas.

        Returns:
            ``(content, tool_calls, finish_reason)``: ``tool_calls`` is a list of OpenAI
            ``ChatCompletionMessageToolCall`` (finish_reason ``"tool_calls"``), or None with
            ``content == raw_text`` and finish_reason ``"stop"``.
        """
        if not tools or tool_choice == "none":
            return raw_text, None, "stop"
        from openai.types.chat import ChatCompletionMessageToolCall
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        try:
            request = ChatCompletionRequest(
                model="atroposlib", messages=[{"role": "user", "content": ""}],
                tools=[_normalise_tool(t) for t in tools],
                tool_choice=tool_choice if tool_choice is not None else "auto",
            )
            info = self.parser.extract_tool_calls(raw_text, request)
        except Exception as exc:  # noqa: BLE001 - unparseable output stays plain text
            logger.warning("tool parser %s failed on model output: %r", self.parser_name, exc)
            return raw_text, None, "stop"
        if not info.tools_called or not info.tool_calls:
            return raw_text, None, "stop"
        calls = []
        for call in info.tool_calls:
            call_id = getattr(call, "id", None) or f"call_{uuid.uuid4().hex[:24]}"
            calls.append(ChatCompletionMessageToolCall(
                id=call_id, type="function",
                function={"name": call.function.name, "arguments": call.function.arguments},
            ))
            self.call_id_to_raw_text[call_id] = raw_text
        return info.content, calls, "tool_calls"

    # ------------------------------------------------------------------ inbound
    def reconstruct_raw_text_from_tool_calls(self, tool_calls: list[dict[str, Any]]) -> str:
        """The raw model text of an assistant message's ``tool_calls``.

        Calls this translator parsed come back byte-for-byte (one raw text per completion, even
        when it held several calls); unknown calls are rendered Hermes-style, one
        ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` per line.

        Args:
            tool_calls: OpenAI tool call dicts (``id``, ``function.name``, ``function.arguments``).

        Returns:
            The text, or ``""`` for no calls.
        """
        if not tool_calls:
            return ""
        ids = [tc.get("id") for tc in tool_calls]
        if all(i in self.call_id_to_raw_text for i in ids):
            texts: list[str] = []
            for i in ids:
                if self.call_id_to_raw_text[i] not in texts:
                    texts.append(self.call_id_to_raw_text[i])
            return "".join(texts)
        blocks = []
        for tc in tool_calls:
            function = tc.get("function") or {}
            arguments = function.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    pass
            payload = json.dumps({"name": function.get("name"), "arguments": arguments})
            blocks.append(f"<tool_call>{payload}</tool_call>")
        return "\n".join(blocks)

    def convert_messages_for_template(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Replace assistant ``tool_calls`` messages by their raw text for the chat template.

        Args:
            messages: OpenAI chat messages (tool calls as dicts or OpenAI objects).

        Returns:
            A new list: assistant messages with ``tool_calls`` become
            ``{"role": "assistant", "content": raw_text}`` (a message's own content goes before
            calls this translator did not parse); every other message is unchanged.
        """
        out = []
        for message in messages:
            if message.get("role") == "assistant" and message.get("tool_calls"):
                calls = [_as_dict(tc) for tc in message["tool_calls"]]
                raw = self.reconstruct_raw_text_from_tool_calls(calls)
                known = all(tc.get("id") in self.call_id_to_raw_text for tc in calls)
                content = message.get("content")
                if content and not known:  # our own raw text already holds any content
                    raw = f"{content}\n{raw}"
                out.append({"role": "assistant", "content": raw})
            else:
                out.append(message)
        return out

    def decode_with_tool_awareness(self, token_ids: list[int], has_tools: bool = False) -> str:
        """Decode ids, keeping special tokens when tools are active (tool tags may be special)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=not has_tools)


def _as_dict(tool_call: Any) -> dict[str, Any]:
    return tool_call if isinstance(tool_call, dict) else tool_call.model_dump()


def _normalise_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """Fill the fields vLLM's request model requires (``parameters``) in a tool schema."""
    tool = dict(tool)
    function = dict(tool.get("function") or {})
    function.setdefault("parameters", {"type": "object", "properties": {}})
    tool["type"] = tool.get("type", "function")
    tool["function"] = function
    return tool


__all__ = ["VLLM_AVAILABLE", "ToolCallTranslator"]  # noqa: F822 - VLLM_AVAILABLE is resolved by __getattr__
