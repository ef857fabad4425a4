"""Shared pieces of the ecosystem adapters: a tracked OpenAI endpoint, the env class per spec.

Environments from other ecosystems (verifiers, OpenEnv agents, ...) sample through an
OpenAI-compatible client of their own. :class:`TrackedEndpoint` gives that client an
endpoint backed by the env's own inference servers: the ManagedServer proxy
(:mod:`atroposlib.proxy`) served by uvicorn on ``127.0.0.1`` inside the
env's event loop, with one proxy *session* per rollout. Every call made through a session's
``base_url`` is generated from exact token ids, so afterwards the session's tracked
sequences hold the sampled token ids, the sampler's log-probs and a mask that trains only
the model's tokens, across every turn (:func:`rollout_sequences`). :func:`spec_env_class`
builds the env class bound to one foreign environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

from atroposlib.api.models import IGNORE_INDEX

logger = logging.getLogger(__name__)

EnvT = TypeVar("EnvT")


@dataclass
class Sequence:
    """One tracked sequence of a rollout (a proxy node), aligned position by position.

    Attributes:
        tokens: ``[T]`` prompt + completion token ids of every turn.
        masks: ``[T]`` ``-100`` where not trained (prompt, user and tool turns), else the id.
        logprobs: ``[T]`` the sampler's log-prob at generated positions, ``1.0`` elsewhere.
        finish_reason: the finish reason of the last turn.
    """

    tokens: list[int]
    masks: list[int]
    logprobs: list[float]
    finish_reason: str

    @property
    def num_generated(self) -> int:
        """Trained (model-generated) tokens."""
        return sum(1 for m in self.masks if m != IGNORE_INDEX)


def rollout_sequences(state: dict[str, Any]) -> list[Sequence]:
    """The sequences a proxy session tracked (``ProxyManagedServer.fetch_state()``'s answer).

    A multi-turn conversation whose every prompt extends the previous turn is one sequence;
    a conversation restarted from a different prompt adds another.

    Args:
        state: ``{"nodes": [...]}`` as returned by the session (tree sessions are not used).

    Returns:
        One :class:`Sequence` per node, in creation order.
    """
    out = []
    for node in state.get("nodes") or []:
        node = node.model_dump() if hasattr(node, "model_dump") else dict(node)
        out.append(Sequence(
            tokens=list(node["tokens"]),
            masks=list(node["masked_tokens"]),
            logprobs=[float(x) for x in node["logprobs"]],
            finish_reason=str((node.get("metadata") or {}).get("finish_reason", "stop")),
        ))
    return out


def _bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class TrackedEndpoint:
    """The env's inference servers as a token-tracking OpenAI endpoint (see module docstring).

    Use as ``async with TrackedEndpoint(env.server, env.tokenizer, model) as endpoint:``;
    ``await endpoint.session()`` opens one session per rollout (its ``base_url`` goes to the
    foreign client), ``await session.fetch_state()`` reads what it tracked, and
    ``await session.aclose()`` deletes it. When the server manager already talks to an
    external proxy (``--proxy_url``), that proxy is used and nothing is started.

    Args:
        server_manager: the env's ``ServerManager`` (its servers must return token
            log-probs: vLLM, SGLang, TRL's vLLM server or the test ``FakeServer``).
        tokenizer: the served model's HF tokenizer.
        model_name: the model name the endpoint reports.
        tool_parser: how sessions turn ``<tool_call>`` blocks into OpenAI ``tool_calls``
            (``"hermes"``), or None to leave completions as text.
    """

    def __init__(self, server_manager: Any, tokenizer: Any, model_name: str,
                 tool_parser: str | None = "hermes"):
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.tool_parser = tool_parser
        self.url: str | None = getattr(server_manager, "proxy_url", None) or None
        self._server: Any = None
        self._task: asyncio.Task[Any] | None = None
        self._http: Any = None

    async def __aenter__(self) -> TrackedEndpoint:
        import httpx

        self._http = httpx.AsyncClient(timeout=None)
        if self.url is None:
            await self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _start(self) -> None:
        import uvicorn

        from atroposlib.proxy.app import create_app

        app = create_app(server_manager=self.server_manager, tokenizer=self.tokenizer,
                         model_name=self.model_name)
        # lifespan off: the proxy must not close the env's servers when it stops.
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        sock = _bound_socket()
        port = sock.getsockname()[1]
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]),
                                         name="tracked-endpoint")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the tracked endpoint stopped before it started")
            await asyncio.sleep(0.01)
        self.url = f"http://127.0.0.1:{port}"

    async def session(self) -> Any:
        """Open one tracked session (a ``ProxyManagedServer``; ``.base_url`` for OpenAI clients).

        Raises:
            RuntimeError: used outside ``async with``.
            ProxyError: the proxy refused the session (e.g. too many open).
        """
        if self.url is None or self._http is None:
            raise RuntimeError("TrackedEndpoint.session() needs `async with TrackedEndpoint(...)`")
        from atroposlib.inference.clients.proxy_session import create_proxy_session

        return await create_proxy_session(self.url, tool_parser=self.tool_parser,
                                          client=self._http)

    async def aclose(self) -> None:
        """Stop the endpoint (if this object started it) and close its HTTP client."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, timeout=10)
            self._server = self._task = None
            self.url = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None


@contextlib.asynccontextmanager
async def tracked_sessions(endpoint: TrackedEndpoint, count: int) -> AsyncIterator[list[Any]]:
    """Open ``count`` sessions on ``endpoint`` and delete them on exit (also on errors)."""
    sessions: list[Any] = []
    try:
        for _ in range(count):
            sessions.append(await endpoint.session())
        yield sessions
    finally:
        for session in sessions:
            with contextlib.suppress(Exception):
                await session.aclose()


def spec_env_class(base: type[EnvT], spec: str, name: str, doc: str, **attrs: Any) -> type[EnvT]:
    """A subclass of the adapter env ``base`` bound to one foreign environment ``spec``.

    The class is called ``Base[spec]``, lives in ``base``'s module, has the env ``name`` (its
    ``--env`` name), the docstring ``doc`` and the class attributes ``attrs`` (what the adapter
    needs to find the environment again, e.g. its id).
    """
    return type(f"{base.__name__}[{spec}]", (base,), {
        "name": name, **attrs, "__module__": base.__module__, "__doc__": doc,
    })


def model_name_of(server_manager: Any) -> str:
    """The model name the env's first inference server serves (``"model"`` when unknown)."""
    for server in getattr(server_manager, "servers", []):
        name = getattr(getattr(server, "config", None), "model_name", None)
        if name:
            return str(name)
    return "model"


def require_token_logprobs(server_manager: Any) -> None:
    """Fail fast unless every inference server of the env returns exact token ids and log-probs.

    The tracked endpoint generates from token ids through each server's
    ``tokens_and_logprobs_completion``; a plain OpenAI backend cannot, and every rollout would
    fail. Nothing is checked when the env talks to an external proxy (``--proxy_url``).

    Raises:
        ConfigError: a server's backend cannot return token log-probs; the message names its
            URL and the flag that fixes it.
    """
    from atroposlib.errors import ConfigError
    from atroposlib.inference.clients.base import InferenceClient

    if getattr(server_manager, "proxy_url", None):
        return
    base = InferenceClient._tokens_and_logprobs_completion_wrapper
    for server in getattr(server_manager, "servers", []):
        if getattr(type(server), "_tokens_and_logprobs_completion_wrapper", base) is base:
            config = getattr(server, "config", None)
            raise ConfigError(
                f"the inference server at {getattr(config, 'base_url', '?')} is used through the "
                f"{type(server).__name__} backend (server_type "
                f"{getattr(config, 'server_type', '?')!r}), which cannot return the exact token "
                "ids and log-probs this adapter trains on. Pass --openai.server_type vllm (or "
                "sglang, trl) to match the server you run."
            )


__all__ = [
    "Sequence",
    "TrackedEndpoint",
    "model_name_of",
    "require_token_logprobs",
    "rollout_sequences",
    "spec_env_class",
    "tracked_sessions",
]
