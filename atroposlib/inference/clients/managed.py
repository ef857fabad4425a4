"""``ManagedServer``: OpenAI-style calls that record the exact sampled token ids and log-probs.

Why: a trainer must see exactly the tokens the sampler produced, with aligned
sampler log-probs; re-tokenising decoded text can differ. ``ManagedServer`` renders the chat
template itself, generates from token ids through ``InferenceClient.tokens_and_logprobs_completion``
and keeps one :class:`SequenceNode` per sampled sequence:

* ``tokens``        ``[T]`` prompt + completion token ids;
* ``masked_tokens`` ``[T]`` labels: ``-100`` (the ignore index) at prompt positions, the token
  id at generated positions;
* ``logprobs``      ``[T]`` ``1.0`` at prompt positions, the sampler's log-prob elsewhere.

Multi-turn: a new prompt whose text starts with an existing node's ``full_text`` *extends*
that node (its tokens are reused verbatim, earlier completions stay trained), in both chat and
completion mode.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from atroposlib.api.models import IGNORE_INDEX
from atroposlib.inference.clients.chat_template import (  # noqa: F401 - importable from here as before
    HERMES_TOOLS_PROMPT,
    render_chat,
    template_renders_tools,
    with_hermes_tools,
)
from atroposlib.inference.clients.responses import chat_completion_response, completion_response
from atroposlib.inference.clients.sequence_node import SequenceNode, sampled_node
from atroposlib.utils.tool_call_parser import parse_tool_calls

logger = logging.getLogger(__name__)

_FINISH_REASONS = {"stop", "length", "tool_calls", "content_filter", "function_call"}


def _finish_reason(raw: Any) -> str:
    if isinstance(raw, dict):
        raw = raw.get("type", "stop")
    raw = str(raw or "stop")
    return raw if raw in _FINISH_REASONS else ("length" if raw == "length" else "stop")


@functools.cache
def _tool_call_class() -> type:
    """OpenAI's function tool call, also readable as a dict (``call["function"]["name"]``).

    Code written for upstream Atropos indexes tool calls like dicts while OpenAI clients use
    attributes; this type supports both.
    """
    from openai.types.chat import ChatCompletionMessageFunctionToolCall

    class ToolCall(ChatCompletionMessageFunctionToolCall):
        def __getitem__(self, key: str) -> Any:
            return self.model_dump()[key]

        def get(self, key: str, default: Any = None) -> Any:
            return self.model_dump().get(key, default)

    return ToolCall


def _usage(prompt_tokens: int, completion_lengths: list[int]) -> Any:
    """OpenAI ``CompletionUsage`` of one call: the prompt counted once, every choice's tokens."""
    from openai.types import CompletionUsage

    completion = sum(completion_lengths)
    return CompletionUsage(prompt_tokens=prompt_tokens, completion_tokens=completion,
                           total_tokens=prompt_tokens + completion)




class ManagedServer:
    """Wraps one :class:`InferenceClient` and tracks every sampled sequence (see module docstring).

    Use through ``ServerManager.managed_server(tokenizer=...)``::

        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(messages=msgs, n=4, max_tokens=64)
            nodes = managed.get_state()["nodes"]   # one per choice, same order
    """

    def __init__(
        self,
        server: Any,
        tokenizer: Any = None,
        track_tree: bool = False,
        tool_parser: Any = None,
        preserve_think_blocks: bool = False,
    ):
        """Create a tracker.

        Args:
            server: an ``InferenceClient`` implementing ``tokens_and_logprobs_completion``.
            tokenizer: the HF tokenizer of the served model (chat template + encode/decode);
                default: ``server.tokenizer``.
            track_tree: keep every node keyed by ``full_text`` instead of replacing extended
                nodes (for branching rollouts).
            tool_parser: when set (e.g. ``"hermes"``) and the request has ``tools`` (and
                ``tool_choice`` is not ``"none"``), ``<tool_call>{json}</tool_call>`` blocks in
                the completion become OpenAI ``tool_calls`` (finish_reason ``tool_calls``); the
                tracked nodes keep the raw text and tokens. With ``"hermes"`` and a chat
                template that drops ``tools`` (SmolLM2's), the tools are declared in the
                system message in Hermes' format (:data:`HERMES_TOOLS_PROMPT`).
            preserve_think_blocks: let the chat template handle ``<think>`` blocks of earlier
                assistant turns as it likes (default: protect them so they are never
                stripped and multi-turn extension keeps working).

        Raises:
            ValueError: no tokenizer was given and the server has none.
        """
        if tokenizer is None:
            tokenizer = getattr(server, "_tokenizer", None) or getattr(server, "tokenizer", None)
        if tokenizer is None:
            raise ValueError(
                "ManagedServer needs the model's tokenizer: pass "
                "managed_server(tokenizer=self.tokenizer)"
            )
        self.server = server
        self.tokenizer = tokenizer
        self.track_tree = track_tree
        self.tool_parser = tool_parser
        self._translator: Any = None
        self.preserve_think_blocks = preserve_think_blocks
        self.current_nodes: list[SequenceNode] = []
        self.sequences: dict[str, SequenceNode] = {}
        self.tree: dict[str, str | None] = {}
        #: ``CompletionUsage`` of the latest call (None before the first).
        self.last_usage: Any = None

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, Any]:
        """Return the tracked sequences.

        Returns:
            ``{"nodes": [SequenceNode, ...]}`` (default mode, in creation order; the choices
            of the latest call are in choice order), or ``{"sequences": {full_text: node},
            "tree": {full_text: parent_full_text | None}}`` in tree mode.
        """
        if self.track_tree:
            return {"sequences": dict(self.sequences), "tree": dict(self.tree)}
        return {"nodes": list(self.current_nodes)}

    def reset(self) -> None:
        """Forget every tracked sequence."""
        self.current_nodes = []
        self.sequences = {}
        self.tree = {}

    def render_prompt(self, messages: list[dict[str, Any]], tools: Any = None) -> tuple[str, list[int]]:
        """The prompt a ``chat_completion(messages=...)`` would send, without generating.

        Args:
            messages: OpenAI-style chat messages.
            tools: tool schemas passed to the chat template, if any.

        Returns:
            ``(prompt_text, input_ids)``: the rendered chat template and its token ids, where
            a prefix already tracked in a node reuses that node's exact (sampled) token ids.

        Raises:
            Exception: whatever the tokenizer's chat template raises on these messages.
        """
        prompt = self._render_chat(messages, tools)
        _, parent = self._find_parent(prompt)
        return prompt, self._input_ids(prompt, parent)

    # ------------------------------------------------------------------ helpers
    def _render_chat(self, messages: list[dict[str, Any]], tools: Any = None) -> str:
        """Render ``messages`` with the chat template (see :func:`render_chat`)."""
        return render_chat(self.tokenizer, messages, tools, tool_parser=self.tool_parser,
                           preserve_think_blocks=self.preserve_think_blocks)

    def _find_parent(self, prompt: str) -> tuple[int | None, SequenceNode | None]:
        candidates = (
            list(enumerate(self.current_nodes))
            if not self.track_tree
            else [(None, node) for node in self.sequences.values()]
        )
        best: tuple[int | None, SequenceNode | None] = (None, None)
        for index, node in candidates:
            if node.full_text and prompt.startswith(node.full_text):
                if best[1] is None or len(node.full_text) > len(best[1].full_text):
                    best = (index, node)
        return best

    def _input_ids(self, prompt: str, parent: SequenceNode | None) -> list[int]:
        if parent is not None:
            suffix = prompt[len(parent.full_text):]
            return list(parent.tokens) + list(
                self.tokenizer.encode(suffix, add_special_tokens=False) if suffix else []
            )
        return list(self.tokenizer.encode(prompt, add_special_tokens=False))

    async def _generate(
        self, prompt: str, kwargs: dict[str, Any]
    ) -> tuple[list[SequenceNode], list[str]]:
        parent_index, parent = self._find_parent(prompt)
        input_ids = self._input_ids(prompt, parent)
        kwargs = {k: v for k, v in kwargs.items() if k not in ("prompt", "input_ids")}
        prompt_tokens, outputs, logprobs, finish_reasons = (
            await self.server.tokens_and_logprobs_completion(
                input_ids=input_ids, prompt=prompt, **kwargs
            )
        )
        prompt_tokens = list(prompt_tokens) if prompt_tokens else input_ids
        reasons = [_finish_reason(r) for r in finish_reasons]
        nodes = [
            sampled_node(prompt, self.tokenizer.decode(out, skip_special_tokens=False),
                         prompt_tokens, parent, out, lps, reason)
            for out, lps, reason in zip(outputs, logprobs, reasons, strict=True)
        ]
        texts = [self.tokenizer.decode(out, skip_special_tokens=True) for out in outputs]
        self._record(nodes, parent_index, parent)
        self.last_usage = _usage(len(prompt_tokens), [len(out) for out in outputs])
        return nodes, texts

    def _record(
        self, nodes: list[SequenceNode], parent_index: int | None, parent: SequenceNode | None
    ) -> None:
        if self.track_tree:
            for node in nodes:
                self.sequences[node.full_text] = node
                self.tree[node.full_text] = parent.full_text if parent is not None else None
            return
        if parent_index is not None and nodes:
            self.current_nodes[parent_index] = nodes[0]
            self.current_nodes.extend(nodes[1:])
        else:
            self.current_nodes.extend(nodes)

    def _convert_messages_to_prompt(self, messages: list[dict[str, Any]], tools: Any = None) -> str:
        """The chat-template text ``chat_completion(messages=...)`` sends (no generation)."""
        return self._render_chat(messages, tools)

    def _get_translator(self) -> Any:
        """The vLLM-backed :class:`ToolCallTranslator` for ``tool_parser``, or None without vLLM.

        Created once per tracker, so tool call ids it hands out are recognised when the
        conversation comes back (their exact raw text is re-rendered).
        """
        if self._translator is None and self.tool_parser:
            from atroposlib.inference.clients import tool_call_translator

            if tool_call_translator.VLLM_AVAILABLE:
                self._translator = tool_call_translator.ToolCallTranslator(
                    self.tokenizer, parser_name=str(self.tool_parser)
                )
        return self._translator

    def _parse_tool_calls(
        self, translator: Any, prompt: str, node: SequenceNode, text: str, tool_choice: Any, tools: Any
    ) -> tuple[str | None, list[Any]]:
        """Tool calls of one choice: vLLM's parser when available, else the Hermes extractor."""
        tool_call = _tool_call_class()
        if translator is not None:
            raw = node.full_text[len(prompt):]
            content, calls, _ = translator.parse_model_output(raw, tool_choice, tools)
            return content, [tool_call.model_validate(c.model_dump()) for c in calls or []]
        content, calls = parse_tool_calls(text)
        return content, [tool_call.model_validate(c) for c in calls]

    # ------------------------------------------------------------------ OpenAI-style calls
    async def chat_completion(self, **kwargs: Any) -> Any:
        """Chat completion from exact token ids; returns an ``openai`` ``ChatCompletion``.

        Args:
            **kwargs: ``messages`` (required), ``n``, ``max_tokens``, ``temperature``, ``stop``,
                ``tools`` (passed to the chat template), ``tool_choice``, ``split`` ...

        Returns:
            A ChatCompletion with ``n`` choices; ``get_state()`` holds one node per choice.

        Raises:
            ValueError: ``messages`` missing or empty.
            NotImplementedError: the server cannot return token ids and log-probs.
        """
        from openai.types.chat import ChatCompletionMessage

        kwargs = dict(kwargs)
        messages = kwargs.pop("messages", None)
        if not messages:
            raise ValueError("chat_completion needs a non-empty `messages` list")
        tools = kwargs.pop("tools", None)
        tool_choice = kwargs.pop("tool_choice", None)
        parse = bool(self.tool_parser) and bool(tools) and tool_choice != "none"
        translator = self._get_translator() if self.tool_parser else None
        if translator is not None:
            messages = translator.convert_messages_for_template(messages)
        prompt = self._render_chat(messages, tools)
        nodes, texts = await self._generate(prompt, kwargs)
        choices = []
        for node, text in zip(nodes, texts, strict=True):
            message = ChatCompletionMessage.model_construct(role="assistant", content=text)
            finish_reason = node.metadata["finish_reason"]
            if parse:
                content, calls = self._parse_tool_calls(
                    translator, prompt, node, text, tool_choice, tools
                )
                if calls:
                    message = ChatCompletionMessage.model_construct(
                        role="assistant", content=content, tool_calls=calls
                    )
                    if finish_reason == "stop":
                        finish_reason = "tool_calls"
            choices.append((message, finish_reason))
        return chat_completion_response(
            choices, str(kwargs.get("model") or self.server.config.model_name), self.last_usage)

    async def completion(self, **kwargs: Any) -> Any:
        """Text completion from exact token ids; returns an ``openai`` ``Completion``.

        Args:
            **kwargs: ``prompt`` (str, required), ``n``, ``max_tokens``, ``temperature`` ...

        Raises:
            ValueError: ``prompt`` is not a string.
        """
        kwargs = dict(kwargs)
        prompt = kwargs.pop("prompt", None)
        if not isinstance(prompt, str):
            raise ValueError("completion needs `prompt` as a string")
        nodes, texts = await self._generate(prompt, kwargs)
        choices = [(text, node.metadata["finish_reason"])
                   for node, text in zip(nodes, texts, strict=True)]
        return completion_response(
            choices, str(kwargs.get("model") or self.server.config.model_name), self.last_usage)

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        """Prompt log-probs for ``messages`` (rendered with the chat template) or ``prompt``."""
        kwargs = dict(kwargs)
        messages = kwargs.pop("messages", None)
        if messages is not None:
            kwargs["prompt"] = self._render_chat(messages)
        return await self.server.get_logprobs(**kwargs)


class DummyManagedServer(ManagedServer):
    """Managed-mode stand-in for servers without token log-probs (opt-in, for prototyping only).

    Enabled by ``ATROPOS_ALLOW_DUMMY_MANAGED_SERVER=1``. It calls ordinary chat/completion and
    records placeholder nodes (``tokens = range(128)``, ``logprobs = -0.5``,
    ``metadata["dummy_tokens"] = True``): never train on them.
    """

    def __init__(self, server: Any, tokenizer: Any = None, **kwargs: Any):
        """Create the stand-in; ``tokenizer`` is unused."""
        self.server = server
        self.tokenizer = tokenizer
        self.track_tree = False
        self.tool_parser = None
        self.preserve_think_blocks = False
        self.current_nodes = []
        self.sequences = {}
        self.tree = {}

    def _dummy_nodes(self, text_prefix: str, texts: list[str], reasons: list[str]) -> None:
        for text, reason in zip(texts, reasons, strict=True):
            self.current_nodes.append(
                SequenceNode(
                    full_text=text_prefix + text,
                    tokens=list(range(128)),
                    masked_tokens=[IGNORE_INDEX] + list(range(1, 128)),
                    logprobs=[-0.5] * 128,
                    metadata={"finish_reason": reason, "dummy_tokens": True},
                )
            )

    async def chat_completion(self, **kwargs: Any) -> Any:
        """Plain chat completion; records placeholder nodes."""
        result = await self.server.chat_completion(**kwargs)
        prefix = "\n\n".join(f"{m['role']}:{m['content']}" for m in kwargs.get("messages", []))
        texts = [c.message.content or "" for c in result.choices]
        self._dummy_nodes(prefix + "\n\nassistant:", texts, [c.finish_reason for c in result.choices])
        return result

    async def completion(self, **kwargs: Any) -> Any:
        """Plain completion; records placeholder nodes."""
        result = await self.server.completion(**kwargs)
        texts = [c.text for c in result.choices]
        self._dummy_nodes(str(kwargs.get("prompt", "")), texts, [c.finish_reason for c in result.choices])
        return result

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        """Not available for dummy nodes.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("DummyManagedServer cannot compute log-probs")


class ManagedServerAdapter:
    """Make a :class:`ManagedServer` look like an ``openai.AsyncOpenAI`` client.

    Libraries that expect an OpenAI client (e.g. ``verifiers``) call
    ``adapter.chat.completions.create(**kwargs)`` or ``adapter.completions.create(**kwargs)``;
    both go to the managed server, so every call is tracked as sequence nodes exactly like
    ``managed.chat_completion(...)`` / ``managed.completion(...)``.

    Args:
        managed_server: the managed server (from ``server.managed_server(...)``).
        base_url: reported as ``adapter.base_url`` (clients sometimes read it); no request
            goes there.
    """

    class _Completions:
        def __init__(self, create: Any):
            self.create = create

    class _Chat:
        def __init__(self, managed: ManagedServer):
            self.completions = ManagedServerAdapter._Completions(managed.chat_completion)

    def __init__(self, managed_server: ManagedServer, base_url: str = "http://managed-server/v1"):
        self.managed_server = managed_server
        self.base_url = base_url
        self.chat = ManagedServerAdapter._Chat(managed_server)
        self.completions = ManagedServerAdapter._Completions(managed_server.completion)

    def copy(self, **_: Any) -> ManagedServerAdapter:
        """The same adapter (OpenAI clients' ``with_options``-style copies share the server)."""
        return self


__all__ = ["DummyManagedServer", "ManagedServer", "ManagedServerAdapter", "SequenceNode"]
