"""An in-process fake inference backend (``FakeServer``) and an OpenAI-compatible ASGI app.

``FakeServer`` is a real :class:`~atroposlib.inference.clients.base.InferenceClient`
whose "model" is a script: a list of response strings (cycled) or a callable. It supports
``n``, chat and text completions, and exact token ids with log-probs (so ``managed_server``
works), prompt top-k log-probs shaped like vLLM's ``prompt_logprobs`` (so ``get_logprobs`` and
teacher distillation work), truncates at ``max_tokens`` with ``finish_reason="length"``, records
every request, and can simulate outages. ``fake_openai_app()`` serves the same script over HTTP
(``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``, ``/health``) for tests that need
a real socket.

It is the backend of ``--testing`` runs (``ServerManager(testing=True)``) and of ``check_env``,
so it lives with the other backends; ``atroposlib.testing.fake_server`` re-exports it for tests.

Log-probs are deterministic: token ``t`` gets ``-(1 + t % 10) / 10`` so alignment bugs show.
Prompt log-probs are deterministic too (:func:`fake_prompt_logprobs`).

(No ``from __future__ import annotations`` here: FastAPI must see the real ``Request`` type of
the route functions defined inside ``fake_openai_app``.)
"""

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from atroposlib.inference.clients.base import InferenceClient
from atroposlib.inference.clients.config import APIServerConfig
from atroposlib.inference.clients.responses import chat_completion_response, completion_response

#: A scripted response: text, or (text, finish_reason).
Response = str | tuple[str, str]
#: Default script: replies of different lengths, so length-based scores differ within a group.
DEFAULT_RESPONSES = (
    "This is a fake response.",
    "Yes.",
    "A somewhat longer fake response, written for tests.",
    "No idea, sorry.",
)


@dataclass
class FakeRequest:
    """What the fake server received for one call (also passed to callable scripts).

    Attributes:
        kind: "chat", "completion" or "tokens".
        prompt: the prompt text (chat requests: the messages joined as ``role: content``).
        messages: the chat messages, or None.
        n: number of choices asked for.
        index: which choice is being produced (0..n-1), for callable scripts.
        kwargs: every other request parameter.
    """

    kind: str
    prompt: str
    messages: list[dict[str, Any]] | None
    n: int
    index: int = 0
    kwargs: dict[str, Any] = field(default_factory=dict)


def fake_logprob(token_id: int) -> float:
    """Deterministic log-prob of a token under the fake "model": ``-(1 + id % 10) / 10``."""
    return -(1 + token_id % 10) / 10


#: Size of the fake "vocabulary" the prompt top-k candidates are drawn from.
FAKE_VOCAB = 1000


def fake_prompt_logprobs(input_ids: list[int], top_k: int) -> list[dict[int, tuple[float, int]] | None]:
    """Deterministic vLLM-style ``prompt_logprobs`` of a token sequence under the fake "model".

    Like vLLM: position 0 is None (no context); every later position ``p`` maps token id ->
    ``(logprob, rank)`` for the ``top_k`` most likely ids given ``input_ids[p - 1]`` (ranks
    1..k, log-probs ``-0.5 * rank``), plus the actual token ``input_ids[p]`` with rank ``k + 1``
    and log-prob ``-0.5 * (k + 2)`` when it is not among them.

    Args:
        input_ids: ``[P]`` prompt token ids.
        top_k: candidates per position (0 = only the actual token).

    Returns:
        ``[P]`` entries: None, then dicts of ``k`` or ``k + 1`` items.
    """
    out: list[dict[int, tuple[float, int]] | None] = [None] if input_ids else []
    for pos in range(1, len(input_ids)):
        prev, actual = int(input_ids[pos - 1]), int(input_ids[pos])
        entry = {(prev * 31 + 7 * j + 1) % FAKE_VOCAB: (-0.5 * (j + 1), j + 1) for j in range(top_k)}
        if actual not in entry:
            entry[actual] = (-0.5 * (top_k + 2), top_k + 1)
        out.append(entry)
    return out


class FakeServer(InferenceClient):
    """Scripted in-process inference server (see module docstring).

    Example::

        server = FakeServer(["The answer is 4.", "I think 5."], tokenizer=tok)
        env = MyEnv(config, [server])
    """

    def __init__(
        self,
        responses: list[Response] | Callable[[FakeRequest], Response] | None = None,
        tokenizer: Any = None,
        model_name: str = "fake",
        config: APIServerConfig | None = None,
        latency: float = 0.0,
        ignore_n: bool = False,
    ):
        """Create a fake server.

        Args:
            responses: strings cycled over choices and calls, or a callable
                ``f(FakeRequest) -> str | (str, finish_reason)``; default echoes a fixed reply.
            tokenizer: HF tokenizer used for token ids (needed by managed mode); when None,
                the env that uses this server supplies its own (``set_tokenizer_factory``).
            model_name: the model name reported in responses.
            config: server settings (defaults: no health checks, no URL).
            latency: seconds each request sleeps (to exercise concurrency limits).
            ignore_n: answer every chat/completion request with ONE choice, like servers that
                ignore ``n`` (exercises the fan-out fallback).
        """
        super().__init__(
            config
            or APIServerConfig(
                model_name=model_name, base_url=None, api_key=None, health_check=False
            )
        )
        if responses is None:
            responses = list(DEFAULT_RESPONSES)
        if not callable(responses) and not responses:
            raise ValueError("FakeServer needs at least one scripted response")
        self._script = responses
        self._cycle = None if callable(responses) else itertools.cycle(list(responses))
        self._tokenizer = tokenizer
        self._tokenizer_factory: Callable[[], Any] | None = None
        self.latency = latency
        self.ignore_n = ignore_n
        self.requests: list[FakeRequest] = []
        self.healthy = True
        self._failures: list[BaseException] = []
        self.max_concurrency_seen = 0
        self._active = 0

    # ------------------------------------------------------------------ test controls
    @property
    def tokenizer(self) -> Any:
        """The tokenizer used for token ids (explicit, else from the owning env)."""
        if self._tokenizer is None and self._tokenizer_factory is not None:
            self._tokenizer = self._tokenizer_factory()
        return self._tokenizer

    def set_tokenizer_factory(self, factory: Callable[[], Any]) -> None:
        """Use ``factory()`` as tokenizer when none was given (called by ``BaseEnv``)."""
        self._tokenizer_factory = factory

    def fail_next(self, count: int = 1, exc: BaseException | None = None) -> None:
        """Make the next ``count`` requests raise ``exc`` (default: a connection error)."""
        import httpx

        for _ in range(count):
            self._failures.append(exc or httpx.ConnectError("fake server is down"))

    def set_healthy(self, healthy: bool) -> None:
        """Simulate the server going down (False) or coming back (True)."""
        self.healthy = healthy
        self._set_healthy(healthy)

    # ------------------------------------------------------------------ the "model"
    def _reply(self, request: FakeRequest) -> tuple[str, str]:
        raw = self._script(request) if callable(self._script) else next(self._cycle)
        if isinstance(raw, tuple):
            return str(raw[0]), str(raw[1])
        return str(raw), "stop"

    async def _enter(self, request: FakeRequest) -> None:
        self.requests.append(request)
        self._active += 1
        self.max_concurrency_seen = max(self.max_concurrency_seen, self._active)
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
            else:
                await asyncio.sleep(0)
            if not self.healthy:
                import httpx

                raise httpx.ConnectError("fake server is unhealthy")
            if self._failures:
                raise self._failures.pop(0)
        finally:
            self._active -= 1

    def _choices(self, request: FakeRequest, max_tokens: int | None) -> list[tuple[str, str]]:
        out = []
        for index in range(1 if self.ignore_n else request.n):
            request.index = index
            text, reason = self._reply(request)
            if max_tokens is not None and self.tokenizer is not None:
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                if len(ids) > max_tokens:
                    text, reason = self.tokenizer.decode(ids[:max_tokens]), "length"
            elif max_tokens is not None and len(text.split()) > max_tokens:
                text, reason = " ".join(text.split()[:max_tokens]), "length"
            out.append((text, reason))
        return out

    async def _check_health(self) -> bool:
        return self.healthy

    async def _answer(self, kind: str, prompt: str, messages: Any, kwargs: dict[str, Any]) -> Any:
        """Record a chat or text request and build its OpenAI-shaped reply."""
        request = FakeRequest(kind=kind, prompt=prompt, messages=messages,
                              n=int(kwargs.get("n") or 1), kwargs=kwargs)
        await self._enter(request)
        build = chat_completion_response if kind == "chat" else completion_response
        return build(self._choices(request, kwargs.get("max_tokens")),
                     str(kwargs.get("model") or self.config.model_name))

    async def _chat_completion_wrapper(self, **kwargs: Any) -> Any:
        messages = kwargs.get("messages") or []
        prompt = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages)
        return await self._answer("chat", prompt, messages, kwargs)

    async def _completion_wrapper(self, **kwargs: Any) -> Any:
        return await self._answer("completion", str(kwargs.get("prompt", "")), None, kwargs)

    async def _tokens_and_logprobs_completion_wrapper(
        self, **kwargs: Any
    ) -> tuple[list[int], list[list[int]], list[list[float]], list[str]]:
        tokenizer = self.tokenizer
        if tokenizer is None:
            raise ValueError(
                "FakeServer needs a tokenizer for token ids: FakeServer(tokenizer=...) or use "
                "it inside a BaseEnv (which supplies env.tokenizer)"
            )
        input_ids = kwargs.get("input_ids")
        prompt = kwargs.get("prompt")
        if input_ids is None:
            if prompt is None:
                raise ValueError("tokens_and_logprobs_completion needs `prompt` or `input_ids`")
            input_ids = tokenizer.encode(prompt, add_special_tokens=False)
        if prompt is None:
            prompt = tokenizer.decode(input_ids)
        request = FakeRequest(
            kind="tokens",
            prompt=prompt,
            messages=None,
            n=int(kwargs.get("n") or 1),
            kwargs={k: v for k, v in kwargs.items() if k not in ("prompt",)},
        )
        await self._enter(request)
        max_tokens = kwargs.get("max_tokens") or kwargs.get("max_new_tokens")
        eos = getattr(tokenizer, "eos_token_id", None)
        outputs, logprobs, reasons = [], [], []
        for index in range(request.n):
            request.index = index
            text, reason = self._reply(request)
            ids = list(tokenizer.encode(text, add_special_tokens=False))
            if reason == "stop" and eos is not None:
                ids.append(eos)
            if max_tokens is not None and len(ids) > max_tokens:
                ids, reason = ids[:max_tokens], "length"
            outputs.append(ids)
            logprobs.append([fake_logprob(t) for t in ids])
            reasons.append(reason)
        return list(input_ids), outputs, logprobs, reasons

    async def _get_logprobs_wrapper(self, **kwargs: Any) -> dict[str, Any]:
        """Prompt top-k log-probs (:func:`fake_prompt_logprobs`), parsed like ``VLLMClient``'s.

        Returns:
            ``{"prompt_tokens": [P], "prompt_topk_token_ids": [P][<=k+1],
            "prompt_topk_logprobs": [P][<=k+1]}``, rank-sorted; position 0 has empty lists.
        """
        input_ids = kwargs.get("input_ids")
        if input_ids is None:
            if kwargs.get("prompt") is None or self.tokenizer is None:
                raise ValueError("get_logprobs needs input_ids=[...] (or prompt= and a tokenizer)")
            input_ids = self.tokenizer.encode(kwargs["prompt"], add_special_tokens=False)
        top_k = int(kwargs.get("top_k") if kwargs.get("top_k") is not None else 1)
        request = FakeRequest(kind="logprobs", prompt="", messages=None, n=1, kwargs=dict(kwargs))
        await self._enter(request)
        ids_out: list[list[int]] = []
        lps_out: list[list[float]] = []
        for entry in fake_prompt_logprobs(list(input_ids), top_k):
            ranked = sorted((entry or {}).items(), key=lambda kv: kv[1][1])
            ids_out.append([tid for tid, _ in ranked])
            lps_out.append([lp for _, (lp, _) in ranked])
        return {
            "prompt_tokens": list(input_ids),
            "prompt_topk_token_ids": ids_out,
            "prompt_topk_logprobs": lps_out,
        }


def fake_openai_app(server: FakeServer | None = None) -> Any:
    """Build an OpenAI-compatible FastAPI app backed by a :class:`FakeServer` script.

    Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions``,
    ``POST /v1/completions`` (``n`` and ``max_tokens`` honoured). A completion whose ``prompt``
    is a list of token ids is answered like stock vLLM with ``logprobs`` and
    ``return_tokens_as_token_ids``: ``logprobs.tokens = ["token_id:N", ...]`` with the fake
    log-probs (needs ``FakeServer(tokenizer=...)``), so ``server_type="vllm"`` and managed mode
    work against it. With vLLM's ``prompt_logprobs: k`` the choice also carries
    ``prompt_logprobs`` (:func:`fake_prompt_logprobs`, in vLLM's JSON shape), so
    ``VLLMClient.get_logprobs`` works against it.

    Args:
        server: the script to serve; default ``FakeServer()``.

    Returns:
        A FastAPI application (serve it with uvicorn on 127.0.0.1, port 0).
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    server = server or FakeServer()
    app = FastAPI(title="atroposlib fake OpenAI server")
    app.state.server = server

    @app.get("/health")
    async def health() -> Any:
        if not server.healthy:
            return JSONResponse({"status": "down"}, status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> Any:
        if not server.healthy:
            return JSONResponse({"error": {"message": "down"}}, status_code=503)
        return {
            "object": "list",
            "data": [{"id": server.config.model_name, "object": "model", "owned_by": "fake"}],
        }

    def _strip(body: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k not in ("stream",)}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = _strip(await request.json())
        try:
            result = await server._chat_completion_wrapper(**body)
        except Exception as exc:  # noqa: BLE001 - reported to the client as a 503
            return JSONResponse({"error": {"message": str(exc)}}, status_code=503)
        return result.model_dump(exclude_none=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = _strip(await request.json())
        prompt = body.get("prompt")
        try:
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
                if body.get("prompt_logprobs") is not None:
                    return await _prompt_logprobs_completion(body)
                return await _token_completion(body)
            result = await server._completion_wrapper(**body)
        except Exception as exc:  # noqa: BLE001 - reported to the client as a 503
            return JSONResponse({"error": {"message": str(exc)}}, status_code=503)
        return result.model_dump(exclude_none=True)

    async def _token_completion(body: dict[str, Any]) -> dict[str, Any]:
        """vLLM-style completion from token ids, with ``return_tokens_as_token_ids`` logprobs."""
        kwargs = {k: v for k, v in body.items() if k not in ("prompt", "logprobs", "extra_body")}
        kwargs.pop("return_tokens_as_token_ids", None)
        _, outputs, logprobs, reasons = await server._tokens_and_logprobs_completion_wrapper(
            input_ids=body["prompt"], **kwargs
        )
        choices = []
        for index, (ids, lps, reason) in enumerate(zip(outputs, logprobs, reasons, strict=True)):
            choices.append({
                "index": index,
                "text": server.tokenizer.decode(ids),
                "finish_reason": reason,
                "logprobs": {
                    "tokens": [f"token_id:{t}" for t in ids],
                    "token_logprobs": lps,
                    "top_logprobs": None,
                    "text_offset": [],
                },
            })
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": server.config.model_name, "choices": choices}

    async def _prompt_logprobs_completion(body: dict[str, Any]) -> dict[str, Any]:
        """vLLM-style scoring request: one empty completion plus ``prompt_logprobs``."""
        top_k = int(body["prompt_logprobs"])
        await server._enter(
            FakeRequest(kind="logprobs", prompt="", messages=None, n=1, kwargs=dict(body))
        )
        raw = [
            None if entry is None else {
                str(tid): {"logprob": lp, "rank": rank, "decoded_token": f"<{tid}>"}
                for tid, (lp, rank) in entry.items()
            }
            for entry in fake_prompt_logprobs(list(body["prompt"]), top_k)
        ]
        choice = {"index": 0, "text": "", "finish_reason": "length", "logprobs": None,
                  "prompt_logprobs": raw}
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": server.config.model_name, "choices": [choice]}

    return app


class FakeOpenAIServer:
    """Serve :func:`fake_openai_app` with uvicorn in a background thread on 127.0.0.1.

    Use as a context manager; ``base_url`` is ``http://127.0.0.1:PORT/v1``. ``stop()`` and
    ``start()`` again (same port) simulate an inference-server outage.
    """

    def __init__(self, server: FakeServer | None = None, port: int | None = None):
        """Prepare (not start) the server; ``port`` None picks a free port."""
        import socket

        self.server = server or FakeServer()
        if port is None:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self._uvicorn: Any = None
        self._thread: Any = None

    def start(self, timeout: float = 20.0) -> "FakeOpenAIServer":
        """Start serving; returns when the socket accepts requests.

        Raises:
            RuntimeError: the server did not start within ``timeout`` seconds.
        """
        import threading

        import uvicorn

        config = uvicorn.Config(
            fake_openai_app(self.server), host="127.0.0.1", port=self.port, log_level="warning",
            lifespan="off",
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._uvicorn.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uvicorn.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"fake OpenAI server did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (connections are refused until ``start()``)."""
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            self._thread.join(timeout)
            self._uvicorn = None

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = [
    "DEFAULT_RESPONSES",
    "FakeOpenAIServer",
    "FakeRequest",
    "FakeServer",
    "FAKE_VOCAB",
    "fake_logprob",
    "fake_openai_app",
    "fake_prompt_logprobs",
]
