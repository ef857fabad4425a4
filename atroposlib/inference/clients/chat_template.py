"""Render chat messages for a managed server: keep ``<think>`` blocks, declare tools the chat template drops."""

from __future__ import annotations

from typing import Any

_THINK_PLACEHOLDERS = {"<think>": "\x00ATROPOS_THINK_OPEN\x00", "</think>": "\x00ATROPOS_THINK_CLOSE\x00"}


def _protect_think(message: dict[str, Any]) -> dict[str, Any]:
    """Copy of an assistant message with ``<think>`` tags replaced by placeholders."""
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, str) or "think>" not in content:
        return message
    for tag, placeholder in _THINK_PLACEHOLDERS.items():
        content = content.replace(tag, placeholder)
    return {**message, "content": content}


#: The tool declaration Hermes-format models are trained on (``<tools>`` in the system
#: prompt, answers in ``<tool_call>`` blocks: what the ``hermes`` tool parser reads). Added
#: when the model's chat template drops the ``tools`` it is given.
HERMES_TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
_PROBE_TOOL = {"type": "function", "function": {
    "name": "atroposlib_probe_tool", "description": "", "parameters": {"type": "object"}}}


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template shows the ``tools`` it is given to the model.

    Templates without a tools section (SmolLM2's, plain ChatML) drop them silently.
    """
    cached = getattr(tokenizer, "_atroposlib_renders_tools", None)
    if cached is None:
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": "x"}],
                                                 tools=[_PROBE_TOOL], tokenize=False)
            cached = _PROBE_TOOL["function"]["name"] in text
        except Exception:  # noqa: BLE001 - a template that rejects tools does not render them
            cached = False
        try:
            tokenizer._atroposlib_renders_tools = cached
        except AttributeError:
            pass
    return cached


def with_hermes_tools(messages: list[dict[str, Any]], tools: list[Any]) -> list[dict[str, Any]]:
    """``messages`` with :data:`HERMES_TOOLS_PROMPT` for ``tools`` in the system message.

    The block is appended to a leading system message with text content, else it becomes
    the system message.
    """
    import json

    specs = "\n".join(json.dumps(t.get("function", t) if isinstance(t, dict) else t)
                      for t in tools)
    block = HERMES_TOOLS_PROMPT.format(tools=specs)
    if messages and messages[0].get("role") == "system" and isinstance(
            messages[0].get("content"), str):
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{block}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None, *,
                tool_parser: Any = None, preserve_think_blocks: bool = False) -> str:
    """Render ``messages`` with ``tokenizer``'s chat template, keeping ``<think>`` blocks of assistants.

    Some templates (Qwen3, DeepSeek-R1) strip reasoning from earlier assistant turns, which
    would make the rendered prompt differ from the tokens actually sampled, so extension
    would fail; unless ``preserve_think_blocks`` is set, the tags are swapped for
    placeholders before rendering and restored after. A generation prompt is added unless the
    last message is the assistant's.

    Args:
        tokenizer: the served model's HF tokenizer (its ``apply_chat_template``).
        messages: OpenAI-style chat messages.
        tools: tool schemas passed to the template, if any.
        tool_parser: ``"hermes"``: tools the template drops are declared in the system message
            (:func:`with_hermes_tools`).
        preserve_think_blocks: let the template handle ``<think>`` blocks as it likes.

    Returns:
        The rendered prompt text.

    Raises:
        Exception: whatever the tokenizer's chat template raises on these messages.
    """
    add_generation_prompt = not messages or messages[-1].get("role") != "assistant"
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
    if tools:
        kwargs["tools"] = tools
        if tool_parser == "hermes" and not template_renders_tools(tokenizer):
            # the template would drop them: the model would never see its tools
            messages = with_hermes_tools(messages, tools)
    protect = not preserve_think_blocks
    if protect:
        messages = [_protect_think(m) for m in messages]
    text = tokenizer.apply_chat_template(messages, **kwargs)
    if protect:
        for tag, placeholder in _THINK_PLACEHOLDERS.items():
            text = text.replace(placeholder, tag)
    return text


__all__ = ["HERMES_TOOLS_PROMPT", "render_chat", "template_renders_tools", "with_hermes_tools"]
