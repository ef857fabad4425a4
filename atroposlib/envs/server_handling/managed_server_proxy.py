"""An OpenAI-compatible HTTP proxy whose sessions are ``ManagedServer`` token trackers (spec 4.10).

Agent frameworks that only speak the OpenAI API can still produce exact training data: each
*session* owns one :class:`~atroposlib.envs.server_handling.managed_server.ManagedServer`, the
framework points its ``base_url`` at ``http://HOST:PORT/{uuid}/v1``, and the env reads the tracked
token ids, masks and sampler log-probs back from ``GET /{uuid}/nodes``.

Launch (binds 127.0.0.1 by default; pass ``--host 0.0.0.0`` only on a trusted network, the proxy
has no authentication)::

    python -m atroposlib.envs.server_handling.managed_server_proxy --config servers.json --port 9100

``servers.json`` (:class:`ProxyConfig`)::

    {"model_name": "Qwen/Qwen3-1.7B", "tokenizer_name": "Qwen/Qwen3-1.7B",
     "servers": [{"base_url": "http://127.0.0.1:9001/v1", "server_type": "vllm"}]}

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /setup``, ``GET /servers``,
``POST /sessions/create``, ``GET /sessions``, ``POST /{uuid}/v1/chat/completions``,
``POST /{uuid}/v1/chat/completions/render``, ``POST /{uuid}/v1/completions``,
``GET /{uuid}/nodes``, ``DELETE /{uuid}``. Errors use the OpenAI format
``{"error": {"message", "type", "code"}}``.

Better than Atropos 0.4: idle sessions expire (``--session-ttl``, default 1 h), the number of open
sessions is capped (``--max-sessions``, 429 beyond), bad input is a 400 that says how to fix it,
and an unknown or expired uuid is a 404. Calls within one session are serialised (the node list
is shared state); use one session per rollout for parallelism.

Client side: :func:`create_proxy_session` / :class:`ProxyManagedServer` give an env the same
``chat_completion(...)`` + ``get_state()["nodes"]`` interface as a local ``ManagedServer``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import time
import uuid as uuid_lib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.errors import InferenceError, InferenceUnavailableError

logger = logging.getLogger(__name__)

#: Default idle time (seconds) after which a session is deleted.
DEFAULT_SESSION_TTL_S = 3600.0
#: Default cap on open sessions.
DEFAULT_MAX_SESSIONS = 1024
#: Largest ``n`` one chat completion may ask for.
MAX_N = 128


# ====================================================================== configuration
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
                f"proxy config {path} is invalid: {_validation_message(exc)}. Expected "
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


# ====================================================================== wire types
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


class ChatCompletionRequest(BaseModel):
    """Body of ``POST /{uuid}/v1/chat/completions`` (and ``/render``).

    Unknown OpenAI fields (``user``, ``metadata``, ``parallel_tool_calls`` ...) are ignored so that
    stock OpenAI clients work; ``stream=true`` is refused (400) because only whole responses are
    tracked.
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

    @field_validator("messages")
    @classmethod
    def _check_messages(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not messages:
            raise ValueError('messages must hold at least one message, e.g. [{"role": "user", '
                             '"content": "Hi"}]')
        return [check_chat_message(i, m) for i, m in enumerate(messages)]

    def sampling_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``ManagedServer.chat_completion`` (None values dropped).

        Raises:
            ValueError: ``stream`` was requested.
        """
        if self.stream:
            raise ValueError("stream=true is not supported by the proxy; send stream=false")
        out = self.model_dump(exclude={"model", "stream", "max_completion_tokens"}, exclude_none=True)
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


# ====================================================================== errors
class ProxyHTTPError(Exception):
    """An error the proxy answers in OpenAI format (raised inside route handlers).

    Attributes:
        status_code: HTTP status.
        message: what is wrong and how to fix it.
        type: OpenAI error type (``invalid_request_error``, ``not_found_error``, ...).
        code: short machine-readable code.
    """

    def __init__(self, status_code: int, message: str, type: str, code: str | None = None):  # noqa: A002
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.code = code


def _error_body(message: str, type_: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": code}}


def _validation_message(exc: Any) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "; ".join(parts)


# ====================================================================== state
@dataclass
class Session:
    """One open session: a ``ManagedServer`` plus bookkeeping."""

    uuid: str
    managed: Any
    exit_stack: contextlib.AsyncExitStack
    tool_parser: str | None
    base_url: str | None
    track_tree: bool
    created_at: float
    last_used_at: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def nodes(self) -> list[Any]:
        """Tracked nodes (tree mode: every sequence)."""
        state = self.managed.get_state()
        if "nodes" in state:
            return list(state["nodes"])
        return list(state["sequences"].values())


class ProxyState:
    """Backends, tokenizer and sessions of one proxy app."""

    def __init__(self, config: ProxyConfig | None, settings: ProxySettings):
        """Create the state; backends are built lazily (``ensure_backends``)."""
        self.config = config
        self.settings = settings
        self.manager: Any = None
        self.tokenizer: Any = None
        self.sessions: dict[str, Session] = {}
        #: uuids that expired recently, so a late request gets "expired" instead of "unknown".
        self.expired: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.setup_lock = asyncio.Lock()

    async def ensure_backends(self) -> None:
        """Build the ``ServerManager`` and load the tokenizer if not done yet.

        Raises:
            ProxyHTTPError: 503 when no backends are configured.
        """
        if self.manager is not None:
            return
        if self.config is None:
            raise ProxyHTTPError(
                503,
                "the proxy has no inference backends; POST /setup with "
                '{"model_name": ..., "servers": [{"base_url": ..., "server_type": "vllm"}]} '
                "or start it with --config servers.json",
                "server_error",
                "not_configured",
            )
        async with self.setup_lock:
            if self.manager is not None:
                return
            self.tokenizer, self.manager = await self.build_backends(self.config)

    async def build_backends(self, config: ProxyConfig) -> tuple[Any, Any]:
        """Load ``config``'s tokenizer and build its ``ServerManager``; changes no state.

        Returns:
            ``(tokenizer, manager)``, every backend sharing the one tokenizer.

        Raises:
            ProxyHTTPError: 503 when the tokenizer cannot be loaded or the backends cannot be
                built.
        """
        from atroposlib.envs.server_handling.server_manager import ServerManager

        tokenizer_name = config.tokenizer

        def _load() -> Any:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(tokenizer_name)

        try:
            tokenizer = await asyncio.to_thread(_load)
        except Exception as exc:  # noqa: BLE001 - reported with the fix
            raise ProxyHTTPError(
                503,
                f"cannot load tokenizer {tokenizer_name!r}: {exc}; set tokenizer_name in the "
                "proxy config to a local tokenizer directory or an available HF name",
                "server_error",
                "tokenizer_unavailable",
            ) from exc
        try:
            manager = ServerManager(list(config.servers))
        except Exception as exc:  # noqa: BLE001 - reported with the fix
            raise ProxyHTTPError(
                503, f"cannot build the inference backends: {type(exc).__name__}: {exc}",
                "server_error", "backends_unavailable",
            ) from exc
        for server in manager.servers:
            server._tokenizer = tokenizer  # one tokenizer for all backends (no reloads)
        return tokenizer, manager

    async def close_sessions(self) -> int:
        """Delete every session; return how many there were."""
        count = len(self.sessions)
        for session_id in list(self.sessions):
            await self.drop(session_id)
        return count

    async def drop(self, session_id: str, expired: bool = False) -> bool:
        """Delete one session (reset its tracker); return False if it did not exist."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return False
        if expired:
            self.expired[session_id] = time.time()
            while len(self.expired) > 4 * self.settings.max_sessions:
                self.expired.popitem(last=False)
        await session.exit_stack.aclose()
        return True

    async def sweep(self) -> int:
        """Delete sessions idle longer than the TTL (not those with a request in flight)."""
        now = time.time()
        stale = [
            sid
            for sid, s in self.sessions.items()
            if now - s.last_used_at > self.settings.session_ttl_s and not s.lock.locked()
        ]
        for sid in stale:
            logger.info("session %s expired after %.0f s idle", sid, self.settings.session_ttl_s)
            await self.drop(sid, expired=True)
        return len(stale)

    async def get(self, session_id: str) -> Session:
        """Return a live session and mark it used.

        Raises:
            ProxyHTTPError: 404 for an unknown or expired uuid.
        """
        await self.sweep()
        session = self.sessions.get(session_id)
        if session is None:
            if session_id in self.expired:
                raise ProxyHTTPError(
                    404,
                    f"session {session_id} expired after {self.settings.session_ttl_s:g} s idle; "
                    "create a new one with POST /sessions/create (or start the proxy with a "
                    "larger --session-ttl)",
                    "not_found_error",
                    "session_expired",
                )
            raise ProxyHTTPError(
                404,
                f"unknown session {session_id}; create one with POST /sessions/create",
                "not_found_error",
                "session_not_found",
            )
        session.last_used_at = time.time()
        return session

    def info(self, session: Session) -> SessionInfo:
        """Describe a session."""
        return SessionInfo(
            uuid=session.uuid,
            model_name=self.config.model_name if self.config else "",
            tool_parser=session.tool_parser,
            base_url=session.base_url,
            track_tree=session.track_tree,
            created_at=session.created_at,
            last_used_at=session.last_used_at,
            expires_at=session.last_used_at + self.settings.session_ttl_s,
            num_nodes=len(session.nodes()),
        )


def _server_row(server: Any) -> dict[str, Any]:
    config = server.config
    return {
        "base_url": getattr(config, "base_url", None),
        "server_type": config.server_type,
        "model_name": config.model_name,
        "healthy": bool(server.server_healthy),
    }


# ====================================================================== app factory
def create_app(
    config: ProxyConfig | dict[str, Any] | None = None,
    settings: ProxySettings | None = None,
    *,
    server_manager: Any = None,
    tokenizer: Any = None,
    model_name: str | None = None,
) -> Any:
    """Build the proxy's FastAPI app.

    Two forms: ``create_app(config, settings)`` builds its own backends from a config, and
    ``create_app(server_manager=..., tokenizer=..., model_name=...)`` (the Atropos 0.4 form)
    serves an already-built ``ServerManager`` and tokenizer.

    Args:
        config: the backends (a :class:`ProxyConfig` or its dict); None = configure later with
            ``POST /setup``.
        settings: TTL and session cap; default :class:`ProxySettings()`.
        server_manager: a ready ``ServerManager`` to serve (keyword-only; with ``tokenizer``
            and ``model_name``, and without ``config``).
        tokenizer: the HF tokenizer of ``server_manager``'s model.
        model_name: the model name reported by ``/health`` and ``/v1/models``.

    Returns:
        A FastAPI application; serve it with uvicorn.

    Raises:
        pydantic.ValidationError: ``config`` is a dict that does not match :class:`ProxyConfig`.
        TypeError: ``config`` combined with the ``server_manager`` form, or that form missing
            one of its three keywords.
    """
    prebuilt = (server_manager, tokenizer, model_name)
    if any(value is not None for value in prebuilt):
        if config is not None:
            raise TypeError(
                "create_app takes either config (and settings) or server_manager=, tokenizer=, "
                "model_name=, not both"
            )
        if any(value is None for value in prebuilt):
            raise TypeError(
                "create_app(server_manager=..., tokenizer=..., model_name=...) needs all three "
                "keywords"
            )
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    if isinstance(config, dict):
        config = ProxyConfig.model_validate(config)
    state = ProxyState(config, settings or ProxySettings())
    if server_manager is not None:
        # Already-built backends: no validation of their configs (they may be test doubles).
        state.config = ProxyConfig.model_construct(
            model_name=model_name,
            tokenizer_name=getattr(tokenizer, "name_or_path", None),
            servers=[getattr(s, "config", None) for s in getattr(server_manager, "servers", [])],
        )
        state.manager, state.tokenizer = server_manager, tokenizer

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def reaper() -> None:
            interval = min(30.0, max(0.05, state.settings.session_ttl_s / 4))
            while True:
                await asyncio.sleep(interval)
                try:
                    await state.sweep()
                except Exception:  # noqa: BLE001 - keep sweeping
                    logger.exception("session sweep failed")

        if state.config is not None:
            # Load the tokenizer and build the backends now: a bad tokenizer_name fails at
            # start-up, and the first session is not slowed by importing transformers.
            await state.ensure_backends()
        task = asyncio.create_task(reaper(), name="proxy-session-reaper")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await state.close_sessions()
            if state.manager is not None:
                await state.manager.aclose()

    app = FastAPI(title="atroposlib ManagedServer proxy", lifespan=lifespan)
    app.state.proxy = state

    @app.exception_handler(ProxyHTTPError)
    async def _proxy_error(request: Request, exc: ProxyHTTPError) -> JSONResponse:
        return JSONResponse(_error_body(exc.message, exc.type, exc.code), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(
            _error_body(f"invalid request: {_validation_message(exc)}", "invalid_request_error",
                        "invalid_request"),
            status_code=400,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(_error_body(str(exc.detail), type_, None), status_code=exc.status_code)

    async def _generate(session: Session, call: str, kwargs: dict[str, Any]) -> Any:
        async with session.lock:
            try:
                result = await getattr(session.managed, call)(**kwargs)
            except ValueError as exc:
                raise ProxyHTTPError(400, str(exc), "invalid_request_error", "invalid_request") from exc
            except InferenceUnavailableError as exc:
                raise ProxyHTTPError(503, str(exc), "server_error", "backend_unavailable") from exc
            except Exception as exc:  # noqa: BLE001 - any backend failure is a 500 in OpenAI format
                logger.exception("session %s: %s failed", session.uuid, call)
                raise ProxyHTTPError(
                    500, f"inference failed: {type(exc).__name__}: {exc}", "server_error",
                    "inference_failed",
                ) from exc
            finally:
                session.last_used_at = time.time()
        return result.model_dump(mode="json", exclude_none=True)

    # ------------------------------------------------------------------ service
    @app.get("/health")
    async def health() -> dict[str, Any]:
        """``{status, model, sessions, servers, healthy_servers}`` (servers probed now)."""
        servers = state.manager.servers if state.manager is not None else []
        healthy = await asyncio.gather(*(s.check_health() for s in servers))
        return {
            "status": "ok" if state.config is not None else "not_configured",
            "model": state.config.model_name if state.config else None,
            "sessions": len(state.sessions),
            "servers": len(state.config.servers) if state.config else 0,
            "healthy_servers": sum(bool(h) for h in healthy),
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        """OpenAI model list with the one served model."""
        data = []
        if state.config is not None:
            data.append({"id": state.config.model_name, "object": "model",
                         "created": 0, "owned_by": "atroposlib"})
        return {"object": "list", "data": data}

    @app.post("/setup")
    async def setup(body: dict[str, Any]) -> dict[str, Any]:
        """Replace the backends; every open session is deleted (it used the old ones).

        The new backends are built before anything changes: a config whose tokenizer or
        backends cannot be built is a 400 and the previous configuration stays active.
        """
        try:
            config = ProxyConfig.model_validate(body)
        except ValidationError as exc:
            raise ProxyHTTPError(400, f"invalid proxy config: {_validation_message(exc)}",
                                 "invalid_request_error", "invalid_config") from exc
        async with state.setup_lock:
            # Build the new backends first: a failure leaves the working configuration (and
            # its sessions) in place.
            try:
                tokenizer, manager = await state.build_backends(config)
            except ProxyHTTPError as exc:
                raise ProxyHTTPError(
                    400, f"{exc.message}. The previous configuration is still active.",
                    "invalid_request_error", exc.code,
                ) from exc
            dropped = await state.close_sessions()
            old = state.manager
            state.config, state.tokenizer, state.manager = config, tokenizer, manager
        if old is not None:
            await old.aclose()
        return {"status": "ok", "model": config.model_name, "servers": len(config.servers),
                "dropped_sessions": dropped}

    @app.get("/servers")
    async def servers() -> dict[str, Any]:
        """The backends, each with ``base_url``, ``server_type``, ``model_name``, ``healthy``."""
        if state.manager is None:
            rows = [
                {"base_url": c.base_url, "server_type": c.server_type,
                 "model_name": c.model_name, "healthy": None}
                for c in (state.config.servers if state.config else [])
            ]
            return {"servers": rows}
        await asyncio.gather(*(s.check_health() for s in state.manager.servers))
        return {"servers": [_server_row(s) for s in state.manager.servers]}

    # ------------------------------------------------------------------ sessions
    @app.post("/sessions/create")
    async def create_session(body: SessionCreateRequest | None = None) -> SessionInfo:
        """Open a session (404 unknown ``base_url``, 429 when ``max_sessions`` are open)."""
        body = body or SessionCreateRequest()
        await state.ensure_backends()
        await state.sweep()
        if len(state.sessions) >= state.settings.max_sessions:
            raise ProxyHTTPError(
                429,
                f"too many open sessions ({len(state.sessions)} of max_sessions="
                f"{state.settings.max_sessions}); DELETE /{{uuid}} sessions you are done with, "
                "wait for idle ones to expire, or restart the proxy with a larger --max-sessions",
                "rate_limit_error",
                "too_many_sessions",
            )
        stack = contextlib.AsyncExitStack()
        try:
            managed = await stack.enter_async_context(
                state.manager.managed_server(
                    tokenizer=state.tokenizer,
                    base_url=body.base_url,
                    preserve_think_blocks=body.preserve_think_blocks,
                    track_tree=body.track_tree,
                    tool_parser=body.tool_parser,
                )
            )
        except ValueError as exc:
            raise ProxyHTTPError(404, f"{exc}; omit base_url to use the least busy backend",
                                 "not_found_error", "server_not_found") from exc
        except NotImplementedError as exc:
            raise ProxyHTTPError(400, str(exc), "invalid_request_error",
                                 "backend_unsupported") from exc
        now = time.time()
        session = Session(
            uuid=str(uuid_lib.uuid4()),
            managed=managed,
            exit_stack=stack,
            tool_parser=body.tool_parser,
            base_url=getattr(managed.server.config, "base_url", None),
            track_tree=body.track_tree,
            created_at=now,
            last_used_at=now,
        )
        state.sessions[session.uuid] = session
        return state.info(session)

    @app.get("/sessions")
    async def list_sessions() -> dict[str, Any]:
        """``{"sessions": [SessionInfo, ...]}`` (expired ones are swept first)."""
        await state.sweep()
        return {"sessions": [state.info(s).model_dump() for s in state.sessions.values()]}

    @app.post("/{session_id}/v1/chat/completions")
    async def chat_completions(session_id: str, body: ChatCompletionRequest) -> Any:
        """OpenAI chat completion; one tracked node per choice."""
        session = await state.get(session_id)
        try:
            kwargs = body.sampling_kwargs()
        except ValueError as exc:
            raise ProxyHTTPError(400, str(exc), "invalid_request_error", "unsupported") from exc
        return await _generate(session, "chat_completion", kwargs)

    @app.post("/{session_id}/v1/completions")
    async def completions(session_id: str, body: CompletionRequest) -> Any:
        """OpenAI text completion from a raw prompt; one tracked node per choice."""
        session = await state.get(session_id)
        if body.stream:
            raise ProxyHTTPError(400, "stream=true is not supported; send stream=false",
                                 "invalid_request_error", "unsupported")
        kwargs = body.model_dump(exclude={"model", "stream"}, exclude_none=True)
        return await _generate(session, "completion", kwargs)

    @app.post("/{session_id}/v1/chat/completions/render")
    async def render(session_id: str, body: ChatCompletionRequest) -> RenderResponse:
        """The prompt text and token ids a chat completion would send (no generation)."""
        session = await state.get(session_id)
        managed = session.managed
        try:
            prompt, ids = managed.render_prompt(body.messages, body.tools)
        except Exception as exc:  # noqa: BLE001 - template errors are the caller's input
            raise ProxyHTTPError(400, f"chat template failed on these messages: {exc}",
                                 "invalid_request_error", "template_error") from exc
        return RenderResponse(prompt_text=prompt, token_ids=ids, num_tokens=len(ids))

    @app.get("/{session_id}/nodes")
    async def nodes(session_id: str) -> dict[str, Any]:
        """``{"nodes": [{full_text, tokens, masked_tokens, logprobs, metadata}, ...]}``.

        Tree sessions also get ``"tree": {full_text: parent_full_text | None}``.
        """
        session = await state.get(session_id)
        out: dict[str, Any] = {"nodes": [n.model_dump() for n in session.nodes()]}
        if session.track_tree:
            out["tree"] = session.managed.get_state()["tree"]
        return out

    @app.delete("/{session_id}")
    async def delete_session(session_id: str) -> dict[str, Any]:
        """Delete a session (404 if unknown)."""
        await state.get(session_id)
        await state.drop(session_id)
        return {"uuid": session_id, "deleted": True}

    return app


# ====================================================================== client side
class ProxyError(InferenceError):
    """The proxy refused or failed a request.

    Attributes:
        status_code: HTTP status of the answer.
        type: OpenAI error type from the body (e.g. ``not_found_error``).
        code: error code from the body (e.g. ``session_expired``).
    """

    def __init__(self, status_code: int, message: str, type: str | None = None,  # noqa: A002
                 code: str | None = None):
        super().__init__(f"proxy answered {status_code}: {message}")
        self.status_code = status_code
        self.type = type
        self.code = code


def _raise_for_error(response: Any) -> None:
    if response.status_code < 400:
        return
    try:
        error = response.json().get("error", {})
    except ValueError:
        error = {"message": response.text}
    raise ProxyError(response.status_code, str(error.get("message")), error.get("type"),
                     error.get("code"))


class ProxyManagedServer:
    """A ``ManagedServer`` living in a proxy session, used over HTTP (httpx, async).

    Same interface as a local ``ManagedServer``: ``await chat_completion(...)`` /
    ``await completion(...)`` return ``openai`` objects, and ``get_state()["nodes"]`` holds the
    tracked :class:`SequenceNode` s (refreshed after every call; ``await fetch_state()`` to
    refresh explicitly). Close with ``await aclose()`` (deletes the session) or use
    ``async with``.
    """

    def __init__(self, proxy_url: str, session: dict[str, Any], client: Any = None,
                 timeout: float = 1200.0):
        """Wrap an existing session.

        Args:
            proxy_url: proxy root, e.g. ``http://127.0.0.1:9100``.
            session: the ``POST /sessions/create`` answer (needs ``uuid``).
            client: an ``httpx.AsyncClient`` to share; default: own client.
            timeout: seconds per request (generations can be long).
        """
        import httpx

        self.proxy_url = proxy_url.rstrip("/")
        self.session = dict(session)
        self.uuid: str = session["uuid"]
        self._owns_client = client is None
        self.client = client or httpx.AsyncClient(timeout=timeout)
        self._nodes: list[Any] = []
        self._tree: dict[str, Any] | None = None

    @property
    def base_url(self) -> str:
        """OpenAI ``base_url`` of this session, for agent frameworks (``.../{uuid}/v1``)."""
        return f"{self.proxy_url}/{self.uuid}/v1"

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.client.post(f"{self.proxy_url}/{self.uuid}{path}", json=body)
        _raise_for_error(response)
        return response.json()

    async def chat_completion(self, **kwargs: Any) -> Any:
        """Chat completion through the proxy; returns an ``openai`` ``ChatCompletion``.

        Args:
            **kwargs: ``messages`` (required), ``n``, ``max_tokens``, ``temperature``, ``stop``,
                ``tools``, ``tool_choice``; ``split`` is accepted and ignored.

        Raises:
            ProxyError: 400 bad input, 404 unknown/expired session, 5xx backend failure.
        """
        from openai.types.chat import ChatCompletion

        kwargs.pop("split", None)
        data = await self._post("/v1/chat/completions", kwargs)
        await self.fetch_state()
        return ChatCompletion.model_validate(data)

    async def completion(self, **kwargs: Any) -> Any:
        """Text completion through the proxy; returns an ``openai`` ``Completion``.

        Raises:
            ProxyError: as :meth:`chat_completion`.
        """
        from openai.types import Completion

        kwargs.pop("split", None)
        data = await self._post("/v1/completions", kwargs)
        await self.fetch_state()
        return Completion.model_validate(data)

    async def render(self, messages: list[dict[str, Any]], tools: Any = None) -> dict[str, Any]:
        """``{prompt_text, token_ids, num_tokens}`` for ``messages`` (nothing is generated)."""
        body: dict[str, Any] = {"messages": messages}
        if tools:
            body["tools"] = tools
        return await self._post("/v1/chat/completions/render", body)

    async def fetch_state(self) -> dict[str, Any]:
        """Download the tracked nodes and return :meth:`get_state`.

        Raises:
            ProxyError: the session is gone (404).
        """
        from atroposlib.envs.server_handling.managed_server import SequenceNode

        response = await self.client.get(f"{self.proxy_url}/{self.uuid}/nodes")
        _raise_for_error(response)
        data = response.json()
        self._nodes = [SequenceNode(**node) for node in data["nodes"]]
        self._tree = data.get("tree")
        return self.get_state()

    def get_state(self) -> dict[str, Any]:
        """``{"nodes": [SequenceNode, ...]}`` as of the last call (tree sessions: also "tree")."""
        state: dict[str, Any] = {"nodes": list(self._nodes)}
        if self._tree is not None:
            state["tree"] = dict(self._tree)
        return state

    def reset(self) -> None:
        """Forget the local copy of the nodes (the proxy session keeps its own until deleted)."""
        self._nodes, self._tree = [], None

    async def aclose(self) -> None:
        """Delete the session on the proxy (a session already gone is fine) and close the client."""
        try:
            response = await self.client.delete(f"{self.proxy_url}/{self.uuid}")
            if response.status_code != 404:
                _raise_for_error(response)
        finally:
            if self._owns_client:
                await self.client.aclose()

    async def __aenter__(self) -> ProxyManagedServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def create_proxy_session(
    proxy_url: str,
    tool_parser: str | None = "hermes",
    track_tree: bool = False,
    base_url: str | None = None,
    client: Any = None,
    timeout: float = 1200.0,
    preserve_think_blocks: bool = False,
) -> ProxyManagedServer:
    """Open a session on a running proxy and return its client.

    Args:
        proxy_url: proxy root, e.g. ``http://127.0.0.1:9100``.
        tool_parser: ``"hermes"`` (default) or None.
        track_tree: tree mode (see ``ManagedServer``).
        base_url: pin a backend by its base URL.
        client: an ``httpx.AsyncClient`` to share.
        timeout: seconds per request.
        preserve_think_blocks: see ``ManagedServer``.

    Returns:
        A :class:`ProxyManagedServer` (delete it with ``await aclose()`` or ``async with``).

    Raises:
        ProxyError: 404 unknown ``base_url``, 429 too many sessions, 503 not configured.
    """
    import httpx

    own = client is None
    http = client or httpx.AsyncClient(timeout=timeout)
    body = {
        "tool_parser": tool_parser,
        "track_tree": track_tree,
        "base_url": base_url,
        "preserve_think_blocks": preserve_think_blocks,
    }
    try:
        response = await http.post(f"{proxy_url.rstrip('/')}/sessions/create", json=body)
        _raise_for_error(response)
    except BaseException:
        if own:
            await http.aclose()
        raise
    proxy = ProxyManagedServer(proxy_url, response.json(), client=http, timeout=timeout)
    proxy._owns_client = own
    return proxy


# ====================================================================== CLI
def build_parser() -> argparse.ArgumentParser:
    """The command-line parser of ``python -m ...managed_server_proxy``."""
    parser = argparse.ArgumentParser(
        prog="python -m atroposlib.envs.server_handling.managed_server_proxy",
        description="OpenAI-compatible proxy whose sessions track exact token ids and "
        "log-probs (ManagedServer) for agent frameworks.",
    )
    parser.add_argument("--config", type=Path, default=None,
                        help="servers.json: {model_name, servers: [{base_url, server_type, "
                        "api_key?}], tokenizer_name?}; omit to configure later via POST /setup")
    parser.add_argument("--host", default="127.0.0.1",
                        help="bind address (default 127.0.0.1; use 0.0.0.0 only on a trusted "
                        "network: there is no authentication)")
    parser.add_argument("--port", type=int, default=9100, help="TCP port (default 9100)")
    parser.add_argument("--session-ttl", type=float, default=DEFAULT_SESSION_TTL_S,
                        help="seconds a session may stay idle before it is deleted "
                        f"(default {DEFAULT_SESSION_TTL_S:g})")
    parser.add_argument("--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS,
                        help=f"most open sessions; more answer 429 (default {DEFAULT_MAX_SESSIONS})")
    parser.add_argument("--log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug"])
    return parser


def main(argv: list[str] | None = None) -> None:
    """Run the proxy with uvicorn (blocks until interrupted).

    Raises:
        SystemExit: bad flags or an invalid config file (exit code 2, with the reason).
    """
    from atroposlib.errors import ConfigError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = ProxyConfig.from_file(args.config) if args.config else None
        settings = ProxySettings(session_ttl_s=args.session_ttl, max_sessions=args.max_sessions)
    except ConfigError as exc:
        parser.error(str(exc))
    except ValidationError as exc:
        parser.error(_validation_message(exc))
    import uvicorn

    logging.basicConfig(level=args.log_level.upper())
    uvicorn.run(create_app(config, settings), host=args.host, port=args.port,
                log_level=args.log_level)


__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "ProxyConfig",
    "ProxyError",
    "ProxyManagedServer",
    "ProxySettings",
    "RenderResponse",
    "SessionCreateRequest",
    "SessionInfo",
    "build_parser",
    "create_app",
    "create_proxy_session",
    "main",
]

if __name__ == "__main__":
    main()
