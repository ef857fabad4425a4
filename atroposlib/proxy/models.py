"""Wire types and configuration of the ManagedServer proxy (pydantic, no FastAPI).

``ProxyConfig`` is the ``servers.json`` file and the ``POST /setup`` body, ``ProxySettings`` the
runtime limits given on the command line; the rest are request and response bodies of the
routes. Nothing here imports the server manager, FastAPI or a tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from atroposlib.inference.clients.config import APIServerConfig
from atroposlib.proxy.errors import validation_message

#: Default idle time (seconds) after which a session is deleted.
DEFAULT_SESSION_TTL_S = 3600.0
#: Default cap on open sessions.
DEFAULT_MAX_SESSIONS = 1024
#: Largest ``n`` one chat completion may ask for.
MAX_N = 128


# ------------------------------------------------------------------ configuration
class ProxyConfig(BaseModel):
    """The backends of the proxy: the ``--config servers.json`` file and the ``POST /setup`` body.

    Each ``servers`` entry is an :class:`APIServerConfig` (``base_url``, ``server_type``,
    ``api_key`` and any other field); ``model_name`` and ``tokenizer_name`` are filled in from the
    top level where an entry leaves them out, and ``server_type`` defaults to ``"vllm"`` (the
    ``openai`` type cannot return token ids, so it cannot back a session).
    """

    model_config = ConfigDict(extra="forbid")

    model_name: str = Field(description="Model name served by every backend (sent as `model`).")
    servers: list[APIServerConfig] = Field(
        min_length=1,
        description='Inference backends, e.g. [{"base_url": "http://127.0.0.1:9001/v1", '
        '"server_type": "vllm"}].',
    )
    tokenizer_name: str | None = Field(
        default=None,
        description="HF tokenizer (name or local dir) for chat templates and token ids; "
        "default: model_name.",
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_servers(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("servers"), list):
            return data
        defaults: dict[str, Any] = {"server_type": "vllm"}
        if "model_name" in data:
            defaults["model_name"] = data["model_name"]
        if data.get("tokenizer_name"):
            defaults["tokenizer_name"] = data["tokenizer_name"]
        servers = [
            {**defaults, **entry} if isinstance(entry, dict) else entry for entry in data["servers"]
        ]
        return {**data, "servers": servers}

    @property
    def tokenizer(self) -> str:
        """The tokenizer to load: ``tokenizer_name``, else ``model_name``."""
        return self.tokenizer_name or self.model_name

    @classmethod
    def from_file(cls, path: str | Path) -> ProxyConfig:
        """Load and validate a ``servers.json`` file.

        Raises:
            ConfigError: the file is missing, not JSON, or does not match the schema.
        """
        import orjson

        from atroposlib.errors import ConfigError

        try:
            raw = orjson.loads(Path(path).read_bytes())
        except FileNotFoundError:
            raise ConfigError(f"proxy config {path} does not exist; pass --config servers.json") from None
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"proxy config {path} is not valid JSON: {exc}") from None
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise ConfigError(
                f"proxy config {path} is invalid: {validation_message(exc)}. Expected "
                '{"model_name": ..., "servers": [{"base_url": ..., "server_type": "vllm"}], '
                '"tokenizer_name": ...}'
            ) from None


class ProxySettings(BaseModel):
    """Runtime limits of the proxy (command-line flags, not part of ``servers.json``)."""

    model_config = ConfigDict(extra="forbid")

    session_ttl_s: float = Field(
        default=DEFAULT_SESSION_TTL_S,
        gt=0,
        description="Seconds a session may stay idle (no request) before it is deleted.",
    )
    max_sessions: int = Field(
        default=DEFAULT_MAX_SESSIONS,
        ge=1,
        description="Most open sessions; creating one more answers 429.",
    )


# ------------------------------------------------------------------ wire types
class SessionCreateRequest(BaseModel):
    """Body of ``POST /sessions/create``."""

    model_config = ConfigDict(extra="forbid")

    tool_parser: str | None = Field(
        default="hermes",
        description='Parse <tool_call> blocks into OpenAI tool_calls ("hermes"); null = off.',
    )
    track_tree: bool = Field(
        default=False, description="Keep every branch (tree mode) instead of extending in place."
    )
    base_url: str | None = Field(
        default=None, description="Pin the session to this backend (404 if unknown)."
    )
    preserve_think_blocks: bool = Field(
        default=False, description="Let the chat template strip <think> blocks of earlier turns."
    )


class SessionInfo(BaseModel):
    """One session as reported by ``POST /sessions/create`` and ``GET /sessions``."""

    uuid: str
    model_name: str
    tool_parser: str | None
    base_url: str | None = Field(description="The backend this session generates on.")
    track_tree: bool = False
    created_at: float = Field(description="Unix time (s) of creation.")
    last_used_at: float = Field(description="Unix time (s) of the last request.")
    expires_at: float = Field(description="Unix time (s) at which it expires if left idle.")
    num_nodes: int = Field(default=0, description="Tracked sequences so far.")


#: Content-part types whose text a text-only model can take, per role (OpenAI chat format).
_TEXT_PART_TYPES = {"assistant": ("text", "refusal")}
_CONTENT_HINT = ('give a string, or a list of text parts like [{"type": "text", "text": "..."}]')


def check_chat_message(index: int, message: dict[str, Any]) -> dict[str, Any]:
    """Check one OpenAI chat message and return it with its content as one string.

    The OpenAI rules: every message has a ``role``; ``content`` is a string or a list of
    content parts, and may be missing or null only on an ``assistant`` message that carries
    ``tool_calls`` (or the legacy ``function_call``), where it becomes ``""``. This proxy
    serves a text-only model, so the parts must be ``{"type": "text", "text": str}`` (an
    assistant may also send ``{"type": "refusal", "refusal": str}``); their strings are joined
    with a newline (as vLLM does) so the chat template always sees a string.

    Args:
        index: the message's position, for the error message.
        message: the message as sent.

    Returns:
        A copy of ``message`` whose ``content`` is a string.

    Raises:
        ValueError: what is wrong with ``messages[index]`` and how to fix it (a 400).
    """
    where = f"messages[{index}]"
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise ValueError(f"{where} has no 'role' (or it is not a string); each message needs a "
                         'role and content, e.g. {"role": "user", "content": "Hi"}')
    content = message.get("content")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None and not isinstance(tool_calls, list):
        raise ValueError(f"{where}.tool_calls must be a list of tool calls, got "
                         f"{type(tool_calls).__name__}")
    if content is None:
        if role == "assistant" and (tool_calls or message.get("function_call")):
            return {**message, "content": ""}
        missing = "has no 'content'" if "content" not in message else "has content null"
        raise ValueError(f"{where} (role {role!r}) {missing}; {_CONTENT_HINT} (only an "
                         "assistant message with tool_calls may leave content out)")
    if isinstance(content, str):
        return message
    if not isinstance(content, list):
        raise ValueError(f"{where}.content must be a string or a list of content parts, got "
                         f"{type(content).__name__}; {_CONTENT_HINT}")
    allowed = _TEXT_PART_TYPES.get(role, ("text",))
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in allowed:
            got = f"type {kind!r}" if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"{where}.content[{j}] is {got}; this proxy serves a text-only "
                             f"model: send parts of type {' or '.join(map(repr, allowed))} "
                             "(e.g. {\"type\": \"text\", \"text\": \"...\"}) or a string")
        text = part.get(kind)
        if not isinstance(text, str):
            raise ValueError(f"{where}.content[{j}] of type {kind!r} needs a string {kind!r} "
                             f"field, got {type(text).__name__}")
        texts.append(text)
    return {**message, "content": "\n".join(texts)}


class ChatMessage(BaseModel):
    """One OpenAI chat message (Atropos 0.4's typed form of an item of ``messages``).

    The proxy itself takes messages as dicts (checked by :func:`check_chat_message`); this model
    is for code that builds them typed. Fields OpenAI adds later are kept (``extra="allow"``);
    ``model_dump(exclude_none=True)`` gives the dict to send.
    """

    model_config = ConfigDict(extra="allow")

    role: str = Field(description='"system", "user", "assistant" or "tool".')
    content: str | list[dict[str, Any]] | None = Field(
        default=None, description="Text, or OpenAI content parts; None for a tool-call-only turn."
    )
    tool_calls: list[dict[str, Any]] | None = Field(default=None, description="OpenAI tool calls.")
    tool_call_id: str | None = Field(default=None, description="Which call a tool message answers.")
    name: str | None = None


class ChatCompletionRequest(BaseModel):
    """Body of ``POST /{uuid}/v1/chat/completions`` (and ``/render``).

    Unknown OpenAI fields (``user``, ``metadata``, ``parallel_tool_calls`` ...) are ignored so that
    stock OpenAI clients work. ``stream=true`` is answered with the whole response sent as
    server-sent events (see :mod:`~atroposlib.proxy.streaming`), since only
    whole responses are tracked.
    """

    model_config = ConfigDict(extra="ignore")

    messages: list[dict[str, Any]] = Field(
        description="OpenAI chat messages, at least one: [{role, content}, ...]."
    )
    model: str | None = Field(default=None, description="Ignored: the proxy's model is used.")
    max_tokens: int | None = Field(default=1024, ge=1, description="Completion length cap (tokens).")
    max_completion_tokens: int | None = Field(default=None, ge=1, description="Alias of max_tokens.")
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature.")
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=MAX_N, description="Choices to sample; one node each.")
    stop: str | list[str] | None = Field(default=None, description="Stop string(s).")
    tools: list[dict[str, Any]] | None = Field(default=None, description="OpenAI tool specs.")
    tool_choice: Any = None
    stream: bool = False
    stream_options: dict[str, Any] | None = Field(
        default=None, description='With stream: {"include_usage": true} adds a usage chunk.'
    )

    @field_validator("messages")
    @classmethod
    def _check_messages(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not messages:
            raise ValueError('messages must hold at least one message, e.g. [{"role": "user", '
                             '"content": "Hi"}]')
        return [check_chat_message(i, m) for i, m in enumerate(messages)]

    def sampling_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``ManagedServer.chat_completion`` (None values dropped)."""
        out = self.model_dump(exclude={"model", "stream", "stream_options", "max_completion_tokens"},
                              exclude_none=True)
        if self.max_completion_tokens is not None:
            out["max_tokens"] = self.max_completion_tokens
        return out


class CompletionRequest(BaseModel):
    """Body of ``POST /{uuid}/v1/completions`` (raw-prompt generation, tracked the same way)."""

    model_config = ConfigDict(extra="ignore")

    prompt: str = Field(min_length=1, description="The prompt text (one string).")
    model: str | None = None
    max_tokens: int | None = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    stream: bool = False


class RenderResponse(BaseModel):
    """Answer of ``/render``: what a chat completion would send to the backend."""

    prompt_text: str = Field(description="The chat template output (with generation prompt).")
    token_ids: list[int] = Field(
        description="[P] prompt token ids as they would be sent (earlier turns' exact ids when "
        "the prompt extends a tracked node)."
    )
    num_tokens: int = Field(description="len(token_ids).")
