"""HTTP clients of the trajectory API, used by environments (async) and trainers (sync).

Both clients speak the Atropos 0.4 wire format (:mod:`atroposlib.api.models`), send a bearer
token when given one, gzip large bodies, and retry transient failures (connection errors, 5xx,
429 with ``Retry-After``) with tenacity. A 4xx other than 429 is never retried: it raises
:class:`~atroposlib.errors.ApiRejectedError` with the server's explanation.

Retries never duplicate or lose data: each ``post_scored_data*`` call sends one
``Idempotency-Key`` (reused by all its retries), so a POST whose reply was lost is stored once;
``get_batch`` retries a ``GET /batch`` whose reply was lost as ``GET /batch?step=N`` for the
step it expected, so the batch the server had already served is answered again, not lost.

Example::

    client = AtroposClient("http://127.0.0.1:8000")
    client.register(Registration(...))
    while (batch := client.get_batch()) is None:
        time.sleep(1)
"""

from __future__ import annotations

import gzip
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from atroposlib.api.models import RegisterEnv, Registration
from atroposlib.defaults import DEFAULT_API_URL
from atroposlib.errors import (
    ApiBackpressureError,
    ApiNotRegisteredError,
    ApiRejectedError,
    ApiUnavailableError,
)

log = logging.getLogger("atroposlib.api.client")

#: Bodies at least this large (bytes) are gzipped when that makes them smaller (as upstream).
GZIP_MIN_BYTES = 1024
#: Response header of ``GET /batch`` naming the step of the batch served.
STEP_HEADER = "X-Atropos-Step"


def new_idempotency_key() -> str:
    """A fresh ``Idempotency-Key`` (random UUID4, hex)."""
    return uuid.uuid4().hex


def _encode_body(payload: Any) -> tuple[bytes, dict[str, str]]:
    """Serialise ``payload`` to JSON, gzipping it when large and compressible."""
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    headers = {"Content-Type": "application/json"}
    if len(body) >= GZIP_MIN_BYTES:
        packed = gzip.compress(body, compresslevel=1)
        if len(packed) < len(body):
            return packed, {**headers, "Content-Encoding": "gzip"}
    return body, headers


def _with_body(payload: Any, kw: dict[str, Any]) -> dict[str, Any]:
    """The httpx ``request`` keywords ``kw`` plus ``payload`` (if not None) as the encoded body."""
    if payload is None:
        return kw
    body, headers = _encode_body(payload)
    return {**kw, "content": body, "headers": {**kw.get("headers", {}), **headers}}


def _check(response: httpx.Response) -> Any:
    """Return the decoded JSON of a 2xx response, or raise the matching ApiError."""
    if response.status_code == 429:
        retry_after = float(response.headers.get("Retry-After", "1") or 1)
        raise ApiBackpressureError(_detail(response), retry_after)
    if 400 <= response.status_code < 500:
        raise ApiRejectedError(response.status_code, _detail(response))
    if response.status_code >= 500:
        raise ApiUnavailableError(f"API answered {response.status_code}: {_detail(response)}")
    if not response.content:
        return None
    if response.headers.get("content-type", "").startswith("application/json"):
        return orjson.loads(response.content)
    return response.text


def _detail(response: httpx.Response) -> Any:
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return response.text
    return body.get("detail", body) if isinstance(body, dict) else body


def _is_transient(exc: BaseException) -> bool:
    return isinstance(
        exc, (httpx.TransportError, ApiUnavailableError, ApiBackpressureError)
    )


def _wait(retry_state: Any) -> float:
    """Honour ``Retry-After`` on 429, else random exponential backoff (0.5 s .. 10 s)."""
    exc = retry_state.outcome.exception() if retry_state.outcome else None
    if isinstance(exc, ApiBackpressureError):
        return min(exc.retry_after, 30.0)
    return wait_random_exponential(multiplier=0.5, max=10)(retry_state)


def _batch_or_none(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    if body.get("status") == "error":
        raise ApiNotRegisteredError(body.get("message", "trainer not registered"))
    return body.get("batch")


@dataclass(frozen=True)
class ResumedSteps:
    """The steps a trainer's ``register()`` resumes after (the server was past ``starting_step``).

    Attributes:
        server_step: the server's ``current_step`` at registration.
        refetched: steps whose served batches the next ``get_batch()`` calls fetch again, in order.
        lost: steps before those whose batches the server no longer keeps: a trainer that
            numbers its steps like the server counts each as a step without an update.
    """

    server_step: int
    refetched: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)


class _ClientBase:
    """Shared configuration of the sync and async clients."""

    def __init__(
        self,
        base_url: str = DEFAULT_API_URL,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_attempts: int = 5,
        max_retry_seconds: float = 120.0,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
    ):
        """Configure a client.

        Args:
            base_url: root URL of ``run-api`` (no trailing path).
            api_key: bearer token; defaults to the ``ATROPOS_API_KEY`` environment variable.
                An empty string is refused (ValueError): it would send no token at all.
            timeout: per-request timeout in seconds.
            max_attempts: attempts per call for transient failures (1 = no retry).
            max_retry_seconds: give up retrying after this many seconds in total.
            transport: an httpx transport (sync client: ``httpx.BaseTransport``, async client:
                ``httpx.AsyncBaseTransport``), e.g. ``httpx.ASGITransport(app)`` in tests.

        Raises:
            ValueError: ``api_key`` is an empty string.
        """
        self.base_url = base_url.rstrip("/")
        if api_key is not None and not api_key.strip():
            raise ValueError("api_key is empty: give the token run-api was started with, or None "
                             "(then $ATROPOS_API_KEY, if set)")
        key = api_key if api_key is not None else os.environ.get("ATROPOS_API_KEY")
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout = timeout
        self._transport = transport
        self._stop = stop_after_attempt(max_attempts) | stop_after_delay(max_retry_seconds)
        #: Step of the last batch received (or the registered starting_step); None: unknown.
        self.last_step: int | None = None
        self._batch_unanswered = False
        #: The server's step at registration: batches up to it are re-fetched by step
        self._replay_until: int | None = None
        #: What the last ``register()`` resumes: None unless the server was past ``starting_step``.
        self.resumed: ResumedSteps | None = None

    def _batch_params(self, attempt: int) -> dict[str, int]:
        """Query of one ``GET /batch`` attempt: ``?step=N`` once a reply may have been lost.

        The first attempt is a plain ``GET /batch`` (as any Atropos client), unless an earlier
        call ended without an answer, or the client is re-fetching the batches served before a
        resume (see :meth:`_note_registration`); retries ask for the step after ``last_step``.
        """
        if self.last_step is None:
            return {}
        replaying = self._replay_until is not None and self.last_step < self._replay_until
        if attempt == 1 and not self._batch_unanswered and not replaying:
            return {}
        return {"step": self.last_step + 1}

    def _note_batch(self, response: httpx.Response) -> list[dict[str, Any]] | None:
        """Decode a ``/batch`` answer and remember the step it carries."""
        batch = _batch_or_none(_check(response))
        self._batch_unanswered = False
        if STEP_HEADER.lower() in response.headers:
            self.last_step = int(response.headers[STEP_HEADER])
        return batch

    def _note_registration(self, registration: Registration, answer: dict[str, Any],
                           announce_lost: bool = True) -> None:
        """Expect the batch after ``starting_step`` next; on a resume, re-fetch the served ones.

        When the server's ``current_step`` is past ``starting_step`` (a trainer restarted from
        a checkpoint), the next calls ask ``GET /batch?step=N`` for N = starting_step + 1 ..
        current_step: the batches served before the restart that the checkpoint does not hold.
        Steps the server no longer keeps are skipped (their groups never reach the weights),
        with a warning unless ``announce_lost`` is False; :attr:`resumed` lists both kinds. A
        server without these answer keys (Atropos 0.4) changes nothing.
        """
        self.last_step = registration.starting_step
        self._batch_unanswered = False
        self.resumed = None
        current, oldest = answer.get("current_step"), answer.get("oldest_replayable_step")
        self._replay_until = current if isinstance(current, int) else None
        if self._replay_until is None or current <= registration.starting_step:
            return
        first = max(oldest if isinstance(oldest, int) else current + 1, registration.starting_step + 1)
        self.resumed = ResumedSteps(server_step=current,
                                    refetched=list(range(first, current + 1)),
                                    lost=list(range(registration.starting_step + 1, first)))
        if self.resumed.lost:
            if announce_lost:
                log.warning("run-api no longer keeps the batches of steps %d..%d (its "
                            "--replay-batches window): their groups will not reach the weights; "
                            "continuing from step %d", registration.starting_step + 1, first - 1, first)
            self.last_step = first - 1

    def _http_kwargs(self) -> dict[str, Any]:
        """Keywords for the ``httpx.Client``/``httpx.AsyncClient`` of this client."""
        return {"base_url": self.base_url, "headers": self._headers, "timeout": self.timeout,
                "transport": self._transport}

    def _retry_kwargs(self) -> dict[str, Any]:
        return {
            "stop": self._stop,
            "wait": _wait,
            "retry": retry_if_exception(_is_transient),
            "reraise": True,
        }


class AtroposClient(_ClientBase):
    """Synchronous client (trainers, tools). Methods mirror the endpoints one to one."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._http = httpx.Client(**self._http_kwargs())

    def close(self) -> None:
        """Close the underlying connection pool."""
        self._http.close()

    def __enter__(self) -> AtroposClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, payload: Any = None, **kw: Any) -> Any:
        """Send one request with retries; return the decoded JSON (or text) body.

        Raises:
            ApiRejectedError: the server answered 4xx (not retried, except 429).
            ApiUnavailableError: connection errors or 5xx persisted past the retries.
        """
        kw = _with_body(payload, kw)
        for attempt in Retrying(**self._retry_kwargs()):
            with attempt:
                return _check(self._send(method, path, **kw))
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise ApiUnavailableError(f"cannot reach {self.base_url}{path}: {exc}") from exc

    def register(self, registration: Registration, announce_lost: bool = True) -> int:
        """``POST /register``; returns the registration uuid (an int).

        The next batch this client expects is then ``starting_step + 1`` (see :meth:`get_batch`):
        after a trainer restarts from the checkpoint of step C, its next calls get the batches
        of steps C+1 .. (the server's step) again, the ones the checkpoint does not hold, and
        then new ones. :attr:`resumed` says which steps come again and which the server no
        longer keeps (logged as a warning unless ``announce_lost`` is False).
        """
        answer = self.request("POST", "/register", registration.model_dump())
        self._note_registration(registration, answer, announce_lost)
        return answer["uuid"]

    def register_env(self, registration: RegisterEnv) -> dict[str, Any]:
        """``POST /register-env``; ``status`` is "success" or "wait for trainer to start"."""
        return self.request("POST", "/register-env", registration.model_dump())

    def disconnect_env(self, env_id: int) -> dict[str, Any]:
        """``POST /disconnect-env``."""
        return self.request("POST", "/disconnect-env", {"env_id": env_id})

    def info(self) -> dict[str, int]:
        """``GET /info``: ``{"batch_size", "max_token_len"}`` (-1 before registration)."""
        return self.request("GET", "/info")

    def wandb_info(self) -> dict[str, str | None]:
        """``GET /wandb_info``: ``{"group", "project"}`` (null before registration)."""
        return self.request("GET", "/wandb_info")

    def status_env(self, env_id: int) -> dict[str, Any]:
        """``GET /status-env`` with the JSON body ``{"env_id": N}``: the six-key env status.

        The id goes in the body, as Atropos 0.4 clients send it, because Atropos 0.4's server
        reads only the body (it answers 422 to ``?env_id=N``); our server accepts both.
        """
        return self.request("GET", "/status-env", {"env_id": env_id})

    def post_scored_data_list(self, groups: list[dict[str, Any]], idempotency_key: str | None = None) -> dict[str, Any]:
        """``POST /scored_data_list`` with several groups (all stored, or none).

        Args:
            groups: wire dicts.
            idempotency_key: sent as ``Idempotency-Key`` on every attempt (default: a new one
                per call); pass the same key again to repeat a call whose outcome is unknown.
        """
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        return self.request("POST", "/scored_data_list", groups, headers=headers)

    def status(self) -> dict[str, int]:
        """``GET /status``: ``{"current_step", "queue_size"}``."""
        return self.request("GET", "/status")

    def get_batch(self) -> list[dict[str, Any]] | None:
        """``GET /batch``: a list of groups summing to batch_size sequences, or None.

        When an attempt gets no answer (connection error, 5xx) the server may have served the
        batch anyway, so the retries (and, after a call that failed, the next call) ask for
        ``GET /batch?step=N``, N being the step after :attr:`last_step`: the server answers that
        batch again if it was served, or serves it now. Once the step is known (after
        :meth:`register` or a first batch), no batch is lost or skipped.

        Raises:
            ApiNotRegisteredError: no trainer has registered yet.
            ApiRejectedError: 409 when the server's step does not match :attr:`last_step`
                (another consumer took batches, or the server was reset).
        """
        for attempt in Retrying(**self._retry_kwargs()):
            with attempt:
                params = self._batch_params(attempt.retry_state.attempt_number)
                self._batch_unanswered = True
                return self._note_batch(self._send("GET", "/batch", params=params))
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    def post_scored_data(self, group: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        """``POST /scored_data`` with one group (gzipped when large).

        Args:
            group: a wire dict.
            idempotency_key: as in :meth:`post_scored_data_list`.
        """
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        return self.request("POST", "/scored_data", group, headers=headers)

    def latest_example(self) -> dict[str, Any]:
        """``GET /latest_example``."""
        return self.request("GET", "/latest_example")

    def observe(self, after: int = 0, limit: int = 100, env_id: int | None = None) -> dict[str, Any]:
        """``GET /observe``: read accepted groups without taking them from the trainer's queue.

        Args:
            after: return groups with a cursor greater than this (0: the oldest still kept).
            limit: most groups to return (1..1000).
            env_id: only this env's groups.

        Returns:
            ``{"groups": [{"cursor", "env_id", "received_at", "group"}], "next_cursor"}``;
            pass ``next_cursor`` as ``after`` on the next call to tail the run.
        """
        params: dict[str, int] = {"after": after, "limit": limit}
        if env_id is not None:
            params["env_id"] = env_id
        return self.request("GET", "/observe", params=params)

    def reset_data(self) -> None:
        """``GET /reset_data`` (wipes the queue and registrations)."""
        self.request("GET", "/reset_data")


class AsyncAtroposClient(_ClientBase):
    """Asynchronous client (environments). Methods mirror the endpoints one to one."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._http = httpx.AsyncClient(**self._http_kwargs())

    async def aclose(self) -> None:
        """Close the underlying connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncAtroposClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def request(
        self,
        method: str,
        path: str,
        payload: Any = None,
        on_retry: Callable[[BaseException], None] | None = None,
        **kw: Any,
    ) -> Any:
        """Send one request with retries; return the decoded JSON (or text) body.

        Args:
            method: HTTP method.
            path: endpoint path, e.g. ``"/scored_data"``.
            payload: JSON-serialisable body (gzipped when large), or None.
            on_retry: called with the exception before each retry (for logging/metrics).
            **kw: passed to ``httpx.AsyncClient.request`` (e.g. ``params``).

        Raises:
            ApiRejectedError: the server answered 4xx (not retried, except 429).
            ApiUnavailableError: connection errors or 5xx persisted past the retries.
        """
        kw = _with_body(payload, kw)
        async for attempt in self._retrying(on_retry):
            with attempt:
                return _check(await self._send(method, path, **kw))
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    def _retrying(self, on_retry: Callable[[BaseException], None] | None) -> AsyncRetrying:
        retrying = AsyncRetrying(**self._retry_kwargs())
        if on_retry is not None:
            retrying = retrying.copy(
                before_sleep=lambda state: on_retry(state.outcome.exception())
            )
        return retrying

    async def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise ApiUnavailableError(f"cannot reach {self.base_url}{path}: {exc}") from exc

    async def register(self, registration: Registration, announce_lost: bool = True) -> int:
        """``POST /register``; returns the registration uuid (an int); see :meth:`AtroposClient.register`."""
        answer = await self.request("POST", "/register", registration.model_dump())
        self._note_registration(registration, answer, announce_lost)
        return answer["uuid"]

    async def register_env(self, registration: RegisterEnv) -> dict[str, Any]:
        """``POST /register-env``; ``status`` is "success" or "wait for trainer to start"."""
        return await self.request("POST", "/register-env", registration.model_dump())

    async def disconnect_env(self, env_id: int) -> dict[str, Any]:
        """``POST /disconnect-env``."""
        return await self.request("POST", "/disconnect-env", {"env_id": env_id})

    async def info(self) -> dict[str, int]:
        """``GET /info``: ``{"batch_size", "max_token_len"}`` (-1 before registration)."""
        return await self.request("GET", "/info")

    async def wandb_info(self) -> dict[str, str | None]:
        """``GET /wandb_info``: ``{"group", "project"}`` (null before registration)."""
        return await self.request("GET", "/wandb_info")

    async def status(self) -> dict[str, int]:
        """``GET /status``: ``{"current_step", "queue_size"}``."""
        return await self.request("GET", "/status")

    async def status_env(self, env_id: int) -> dict[str, Any]:
        """``GET /status-env`` with the JSON body ``{"env_id": N}`` (see the sync client)."""
        return await self.request("GET", "/status-env", {"env_id": env_id})

    async def post_scored_data(
        self, group: dict[str, Any], idempotency_key: str | None = None, **kw: Any
    ) -> dict[str, Any]:
        """``POST /scored_data`` with one group (gzipped when large).

        Args:
            group: a wire dict.
            idempotency_key: sent as ``Idempotency-Key`` on every attempt (default: a new one
                per call); pass the same key again to repeat a call whose outcome is unknown.
            **kw: passed to :meth:`request` (e.g. ``on_retry``).
        """
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        return await self.request("POST", "/scored_data", group, headers=headers, **kw)

    async def post_scored_data_list(
        self, groups: list[dict[str, Any]], idempotency_key: str | None = None, **kw: Any
    ) -> dict[str, Any]:
        """``POST /scored_data_list`` with several groups (one key covers the list)."""
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        return await self.request("POST", "/scored_data_list", groups, headers=headers, **kw)

    async def get_batch(self) -> list[dict[str, Any]] | None:
        """``GET /batch`` with lost-reply recovery (see :meth:`AtroposClient.get_batch`)."""
        async for attempt in self._retrying(None):
            with attempt:
                params = self._batch_params(attempt.retry_state.attempt_number)
                self._batch_unanswered = True
                return self._note_batch(await self._send("GET", "/batch", params=params))
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def latest_example(self) -> dict[str, Any]:
        """``GET /latest_example``."""
        return await self.request("GET", "/latest_example")

    async def observe(
        self, after: int = 0, limit: int = 100, env_id: int | None = None
    ) -> dict[str, Any]:
        """``GET /observe`` (see :meth:`AtroposClient.observe`)."""
        params: dict[str, int] = {"after": after, "limit": limit}
        if env_id is not None:
            params["env_id"] = env_id
        return await self.request("GET", "/observe", params=params)
