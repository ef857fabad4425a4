"""The inference-backend contract: the adaptive semaphore and the ``InferenceClient`` ABC.

One :class:`InferenceClient` exists per inference endpoint (vLLM, SGLang, OpenAI, TRL, or an
in-process fake). The base class owns everything that is the same for every backend:

* two adaptive semaphores (``sem`` for training, ``eval_sem`` for evaluation);
* health gating: a cheap background health check (never a paid completion), and a bounded
  wait for health before each request (``config.timeout`` seconds, then
  :class:`~atroposlib.errors.InferenceUnavailableError`);
* tenacity retries, applied ONCE per request (3 attempts, random-exponential backoff), only on
  transient failures (connection errors, timeouts, 429, 5xx);
* bounded timing/attempt metrics (``rolling_buffer_length``) and ``wandb_metrics()``;
* reasoning-kwargs injection for chat completions (:class:`ReasoningConfig`, with the
  server settings models in :mod:`atroposlib.inference.clients.config`).

Subclasses implement only ``_chat_completion_wrapper``, ``_completion_wrapper`` and, when the
backend can return exact token ids and sampler log-probs, ``_tokens_and_logprobs_completion_wrapper``
(and optionally ``_check_health`` and ``_get_logprobs_wrapper``).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from abc import ABC, abstractmethod
from collections import deque
from typing import Any

from tenacity import (
    AsyncRetrying,
    retry,  # noqa: F401 - Atropos 0.4 code imports it from here
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from atroposlib.errors import InferenceError, InferenceUnavailableError
from atroposlib.inference.clients.config import (  # noqa: F401 - re-exported (Atropos 0.4 path)
    VALID_REASONING_EFFORTS,
    APIServerConfig,
    OpenaiConfig,
    ReasoningConfig,
    ServerBaseline,
)
from atroposlib.utils.lazy_exports import lazy_exports

logger = logging.getLogger(__name__)

#: Seconds between background health checks while a server is healthy / unhealthy.
HEALTH_INTERVAL_HEALTHY = 10.0
HEALTH_INTERVAL_UNHEALTHY = 1.0
#: A health probe that takes longer than this (seconds) counts as unhealthy.
HEALTH_PROBE_TIMEOUT = 10.0
#: Attempts per request (including the first) for transient failures.
REQUEST_ATTEMPTS = 3


class AsyncSemWithAdaptiveWeight:
    """A FIFO async semaphore whose effective size is ``max_val * weight``.

    Waiters are admitted only while ``value > max_val * (1 - weight)``, so an env whose API
    ``env_weight`` is 0.25 uses about a quarter of the server's slots. Use it as
    ``async with sem: ...``.
    """

    def __init__(self, value: int = 1):
        if value < 1:
            raise ValueError(f"semaphore size must be >= 1, got {value}")
        self._value = value
        self.max_val = value
        self.weight = 1.0
        self._waiters: deque[asyncio.Future] = deque()

    @property
    def min_val(self) -> float:
        """Slots held back by the weight: ``max_val * (1 - weight)``."""
        return self.max_val * (1.0 - self.weight)

    @property
    def value(self) -> int:
        """Free slots ignoring the weight (``max_val`` minus holders)."""
        return self._value

    def update_weight(self, weight: float) -> None:
        """Set the weight (clamped to [0.01, 1]) and admit waiters that may now proceed."""
        self.weight = min(1.0, max(0.01, float(weight)))
        self._wake()

    def free_slots(self) -> float:
        """Slots usable now under the current weight (may be fractional or <= 0)."""
        return self._value - self.min_val

    def locked(self) -> bool:
        """True when an ``acquire`` would wait."""
        return not (self._value > self.min_val and self._value > 0)

    async def acquire(self) -> bool:
        """Take one slot, waiting (FIFO) while the semaphore is locked."""
        if not self._waiters and not self.locked():
            self._value -= 1
            return True
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted, then cancelled before use: give the slot back
            else:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            raise
        return True

    def release(self) -> None:
        """Give one slot back and admit the next waiter if the weight allows."""
        self._value += 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and not self.locked():
            fut = self._waiters.popleft()
            if fut.done():
                continue
            self._value -= 1
            fut.set_result(True)

    async def __aenter__(self) -> AsyncSemWithAdaptiveWeight:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


def is_transient_error(exc: BaseException) -> bool:
    """Return True for failures worth retrying: connection/timeouts, 408/409/429 and 5xx.

    Works with openai-python exceptions (``APIConnectionError``, ``APIStatusError``) and httpx
    transport errors; anything else (e.g. 400 Bad Request, a bug in our code) is not retried.
    """
    import httpx

    if isinstance(exc, (httpx.TransportError, asyncio.TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, InferenceUnavailableError):
        return False
    status = getattr(exc, "status_code", None)
    if status is None:
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
    if status is not None:
        return status in (408, 409, 429) or status >= 500
    try:
        import openai
    except ImportError:  # pragma: no cover - openai is a core dependency
        return False
    return isinstance(exc, (openai.APIConnectionError, openai.APITimeoutError))


def _is_connection_error(exc: BaseException) -> bool:
    import httpx

    if isinstance(exc, (httpx.TransportError, ConnectionError)):
        return True
    try:
        import openai
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, openai.APIConnectionError)


class _SplitMetrics:
    """Bounded request timings and attempt counts for one split (train or eval)."""

    def __init__(self, maxlen: int):
        self.timings: deque[float] = deque(maxlen=maxlen)
        self.attempts: deque[int] = deque(maxlen=maxlen)
        self.failures = 0


class InferenceClient(ABC):
    """Abstract inference backend: one instance per endpoint.

    Public calls (all ``async``; keyword arguments are OpenAI request parameters plus
    ``split="train"|"eval"`` to pick the semaphore and metrics):

    * ``chat_completion(messages=..., n=..., max_tokens=...) -> openai ChatCompletion``
    * ``completion(prompt=..., n=..., max_tokens=...) -> openai Completion``
    * ``tokens_and_logprobs_completion(prompt=... | input_ids=..., n=..., max_tokens=...)``
      ``-> (prompt_tokens [P], output_tokens [n][T_k], output_logprobs [n][T_k], finish_reasons [n])``
    * ``get_logprobs(...) -> {"prompt_tokens", "prompt_topk_token_ids", "prompt_topk_logprobs"}``
    * ``check_health() -> bool``

    Subclasses implement ``_chat_completion_wrapper`` and ``_completion_wrapper`` and may
    implement ``_tokens_and_logprobs_completion_wrapper``, ``_get_logprobs_wrapper`` and
    ``_check_health``. Requests wait for health at most ``config.timeout`` seconds
    (then :class:`~atroposlib.errors.InferenceUnavailableError`), and transient failures are
    retried once per request layer (3 attempts in total).
    """

    #: Backoff between attempts (tenacity wait); tests may set ``wait_none()`` on an instance.
    retry_wait: Any = wait_random_exponential(multiplier=1, max=10)

    def __init__(
        self,
        config: APIServerConfig | ServerBaseline,
        reasoning_config: ReasoningConfig | None = None,
    ):
        """Create the server wrapper (no I/O happens here).

        Args:
            config: the endpoint settings.
            reasoning_config: reasoning options injected into chat completions, or None.
        """
        self.config = config
        self.reasoning_config = reasoning_config
        self.sem = AsyncSemWithAdaptiveWeight(config.num_max_requests_at_once)
        self.eval_sem = AsyncSemWithAdaptiveWeight(config.num_requests_for_eval)
        self.server_healthy = not self._health_checks_enabled()
        self._health_task: asyncio.Task | None = None
        self._closing = False
        self._tokenizer: Any = None
        self._healthy_event: asyncio.Event | None = None
        self._metrics = {
            "train": _SplitMetrics(config.rolling_buffer_length),
            "eval": _SplitMetrics(config.rolling_buffer_length),
        }
        self.in_flight = 0

    @property
    def tokenizer(self) -> Any:
        """The HF tokenizer of ``config.tokenizer_name`` (``model_name`` if "none"), loaded once.

        Backends that build token-id prompts from text (vLLM, SGLang, TRL) use it; it is loaded
        lazily so that importing a backend never imports transformers.
        """
        if self._tokenizer is None:
            from atroposlib.utils.hf_tokenizer import load_tokenizer

            name = self.config.tokenizer_name
            if not name or name == "none":
                name = self.config.model_name
            self._tokenizer = load_tokenizer(name)
        return self._tokenizer

    # ------------------------------------------------------------------ identity and health
    @property
    def name(self) -> str:
        """A short label for logs and metrics: the base URL, else the model name."""
        return getattr(self.config, "base_url", None) or self.config.model_name

    def _health_checks_enabled(self) -> bool:
        return bool(getattr(self.config, "health_check", False)) and bool(
            getattr(self.config, "base_url", None)
        )

    async def _check_health(self) -> bool:
        """Backend-specific health probe; must be cheap (no paid completions). Default: True."""
        return True

    async def check_health(self) -> bool:
        """Probe the server now, update ``server_healthy`` and return it.

        Never raises: any exception from the probe, or no answer within
        ``HEALTH_PROBE_TIMEOUT`` seconds, counts as unhealthy.
        """
        try:
            healthy = bool(await asyncio.wait_for(self._check_health(), HEALTH_PROBE_TIMEOUT))
        except Exception as exc:  # noqa: BLE001 - a failing probe simply means "unhealthy"
            logger.debug("health check of %s failed: %r", self.name, exc)
            healthy = False
        self._set_healthy(healthy)
        return healthy

    def _set_healthy(self, healthy: bool) -> None:
        if healthy != self.server_healthy:
            logger.log(
                logging.INFO if healthy else logging.WARNING,
                "inference server %s is now %s",
                self.name,
                "healthy" if healthy else "UNHEALTHY",
            )
        self.server_healthy = healthy
        if self._healthy_event is not None:
            if healthy:
                self._healthy_event.set()
            else:
                self._healthy_event.clear()

    def _ensure_health_task(self) -> None:
        if self._healthy_event is None:
            self._healthy_event = asyncio.Event()
            if self.server_healthy:
                self._healthy_event.set()
        if not self._health_checks_enabled():
            return
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.get_running_loop().create_task(
                self._health_loop(), name=f"health:{self.name}"
            )

    async def _health_loop(self) -> None:
        while not self._closing:
            healthy = await self.check_health()
            if self._closing:
                return
            await asyncio.sleep(HEALTH_INTERVAL_HEALTHY if healthy else HEALTH_INTERVAL_UNHEALTHY)

    async def wait_until_healthy(self, timeout: float | None = None) -> None:
        """Wait until the server is healthy.

        Args:
            timeout: seconds to wait; defaults to ``config.timeout``.

        Raises:
            InferenceUnavailableError: still unhealthy after ``timeout`` seconds.
        """
        self._ensure_health_task()
        if self.server_healthy:
            return
        timeout = self.config.timeout if timeout is None else timeout
        assert self._healthy_event is not None
        try:
            await asyncio.wait_for(self._healthy_event.wait(), timeout)
        except TimeoutError:
            raise InferenceUnavailableError(
                f"inference server {self.name} stayed unhealthy for {timeout:.0f} s; check that "
                "it is running and that base_url is right (or set health_check=False)"
            ) from None

    async def aclose(self) -> None:
        """Stop the background health task (subclasses also close their HTTP clients)."""
        task, self._health_task = self._health_task, None
        if task is None:
            return
        self._closing = True
        # On Python 3.11 a cancel that lands while asyncio.wait_for's probe finishes is swallowed
        # (CPython gh-86296): the loop then sleeps on and a plain `await task` hangs forever.
        # So cancel again until it is done; the closing flag stops the loop at its next check.
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
        if not task.cancelled() and task.exception() is not None:
            logger.debug("health task of %s ended with %r", self.name, task.exception())
        self._closing = False

    # ------------------------------------------------------------------ weights and metrics
    def update_weight(self, weight: float) -> None:
        """Scale both semaphores to ``weight`` of their size (the API's ``env_weight``)."""
        self.sem.update_weight(weight)
        self.eval_sem.update_weight(weight)

    def wandb_metrics(
        self, metrics_dict: dict[str, Any] | None = None, server_name: str | None = None
    ) -> dict[str, Any]:
        """Add this server's request metrics to ``metrics_dict`` and return it.

        Keys: ``server/{name}_request_time_avg|std|99p``, ``server/{name}_eval_request_time_*``,
        ``server/{name}_average_num_attempts``, ``server/{name}_eval_retry_rate`` and
        ``server/{name}_failed_requests`` (seconds for times).
        """
        metrics_dict = {} if metrics_dict is None else metrics_dict
        name = server_name or self.name
        for split, prefix in (("train", ""), ("eval", "eval_")):
            m = self._metrics[split]
            if m.timings:
                timings = sorted(m.timings)
                metrics_dict[f"server/{name}_{prefix}request_time_avg"] = statistics.fmean(timings)
                metrics_dict[f"server/{name}_{prefix}request_time_std"] = statistics.pstdev(timings)
                metrics_dict[f"server/{name}_{prefix}request_time_99p"] = timings[
                    min(len(timings) - 1, int(0.99 * len(timings)))
                ]
            if m.attempts:
                if split == "train":
                    metrics_dict[f"server/{name}_average_num_attempts"] = statistics.fmean(
                        m.attempts
                    )
                else:
                    metrics_dict[f"server/{name}_eval_retry_rate"] = sum(
                        1 for a in m.attempts if a > 1
                    ) / len(m.attempts)
            metrics_dict[f"server/{name}_{prefix}failed_requests"] = m.failures
        return metrics_dict

    # Upstream Atropos exposes the per-request metrics as these attributes; ours are bounded
    # to the last ``rolling_buffer_length`` requests.
    @property
    def request_timings(self) -> deque[float]:
        """Seconds taken by recent train-split requests (oldest first)."""
        return self._metrics["train"].timings

    @property
    def attempts_list(self) -> deque[int]:
        """Attempts made by recent train-split requests."""
        return self._metrics["train"].attempts

    @property
    def eval_request_timings(self) -> deque[float]:
        """Seconds taken by recent eval-split requests (oldest first)."""
        return self._metrics["eval"].timings

    @property
    def eval_attempts_list(self) -> deque[int]:
        """Attempts made by recent eval-split requests."""
        return self._metrics["eval"].attempts

    # ------------------------------------------------------------------ request machinery
    def _prepare_kwargs(self, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        split = kwargs.pop("split", "train")
        if split not in ("train", "eval"):
            raise ValueError(f'split must be "train" or "eval", got {split!r}')
        kwargs.setdefault("model", self.config.model_name)
        return split, kwargs

    def _inject_reasoning(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if kwargs.pop("skip_reasoning", False) or self.reasoning_config is None:
            return kwargs
        base_url = getattr(self.config, "base_url", None)
        extra = self.reasoning_config.build_extra_body(base_url)
        if not extra:
            return kwargs
        kwargs["extra_body"] = {**(kwargs.get("extra_body") or {}), **extra}
        if base_url and "api.openai.com" in base_url:
            kwargs["temperature"] = 1.0
            if "max_tokens" in kwargs:
                kwargs["max_completion_tokens"] = kwargs.pop("max_tokens")
        return kwargs

    async def _call(self, wrapper: Any, kwargs: dict[str, Any]) -> Any:
        split, kwargs = self._prepare_kwargs(kwargs)
        metrics = self._metrics[split]
        sem = self.sem if split == "train" else self.eval_sem
        await self.wait_until_healthy()
        attempts = 0
        start = time.perf_counter()
        self.in_flight += 1
        try:
            async with sem:
                async for attempt in AsyncRetrying(
                    stop=stop_after_attempt(REQUEST_ATTEMPTS),
                    wait=self.retry_wait,
                    retry=retry_if_exception(is_transient_error),
                    reraise=True,
                ):
                    with attempt:
                        attempts += 1
                        try:
                            return await wrapper(**kwargs)
                        except Exception as exc:
                            if _is_connection_error(exc) and self._health_checks_enabled():
                                self._set_healthy(False)
                                self._ensure_health_task()
                            raise
        except Exception:
            metrics.failures += 1
            raise
        finally:
            self.in_flight -= 1
            metrics.timings.append(time.perf_counter() - start)
            metrics.attempts.append(attempts)

    async def chat_completion(self, **kwargs: Any) -> Any:
        """Create a chat completion (OpenAI ``ChatCompletion``), with ``n`` choices.

        Args:
            **kwargs: OpenAI chat parameters (``messages``, ``n``, ``max_tokens``,
                ``temperature`` ...), plus ``split`` and ``skip_reasoning``.

        Raises:
            InferenceUnavailableError: the server stayed unhealthy for ``config.timeout`` s.
            Exception: the backend's error after retries (e.g. ``openai.APIStatusError``).
        """
        kwargs = self._inject_reasoning(dict(kwargs))
        return await self._call(self._chat_completion_wrapper, kwargs)

    async def completion(self, **kwargs: Any) -> Any:
        """Create a text completion (OpenAI ``Completion``), with ``n`` choices.

        Args:
            **kwargs: OpenAI completion parameters (``prompt``, ``n``, ``max_tokens`` ...),
                plus ``split``.

        Raises:
            InferenceUnavailableError: the server stayed unhealthy for ``config.timeout`` s.
        """
        kwargs = dict(kwargs)
        kwargs.pop("skip_reasoning", None)
        return await self._call(self._completion_wrapper, kwargs)

    async def tokens_and_logprobs_completion(
        self, **kwargs: Any
    ) -> tuple[list[int], list[list[int]], list[list[float]], list[str]]:
        """Generate from a prompt and return exact token ids with the sampler's log-probs.

        Args:
            **kwargs: ``prompt`` (str) or ``input_ids`` (list[int]), ``n``, ``max_tokens``,
                ``temperature``, ``stop`` ..., plus ``split``.

        Returns:
            ``(prompt_tokens [P], output_tokens [n][T_k], output_logprobs [n][T_k],
            finish_reasons [n])``; ``output_logprobs[k][t]`` is the log-prob of
            ``output_tokens[k][t]`` under the sampling distribution.

        Raises:
            NotImplementedError: this backend cannot return token ids and log-probs.
        """
        kwargs = dict(kwargs)
        kwargs.pop("skip_reasoning", None)
        return await self._call(self._tokens_and_logprobs_completion_wrapper, kwargs)

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        """Return prompt top-k log-probs: ``{"prompt_tokens", "prompt_topk_token_ids", "prompt_topk_logprobs"}``.

        Raises:
            NotImplementedError: this backend cannot score prompts.
        """
        kwargs = dict(kwargs)
        kwargs.pop("skip_reasoning", None)
        return await self._call(self._get_logprobs_wrapper, kwargs)

    @abstractmethod
    async def _chat_completion_wrapper(self, **kwargs: Any) -> Any:
        """Send one chat completion request to the backend (no retries, no semaphore)."""

    @abstractmethod
    async def _completion_wrapper(self, **kwargs: Any) -> Any:
        """Send one completion request to the backend (no retries, no semaphore)."""

    async def _tokens_and_logprobs_completion_wrapper(
        self, **kwargs: Any
    ) -> tuple[list[int], list[list[int]], list[list[float]], list[str]]:
        """Send one token-level generation request; see ``tokens_and_logprobs_completion``."""
        raise NotImplementedError(
            f"{type(self).__name__} (server_type={self.config.server_type!r}) cannot return "
            "token ids and sampler log-probs; use server_type 'vllm' or 'sglang' for "
            "managed_server / ScoredDataGroup.inference_logprobs"
        )

    async def _get_logprobs_wrapper(self, **kwargs: Any) -> dict[str, Any]:
        """Score a prompt; see ``get_logprobs``."""
        raise NotImplementedError(
            f"{type(self).__name__} (server_type={self.config.server_type!r}) cannot return "
            "prompt log-probs"
        )


#: Atropos 0.4's name for :class:`InferenceClient`.
APIServer = InferenceClient

# OpenAI response types and pydantic names Atropos 0.4's module imported; loaded on first access.
__getattr__ = lazy_exports(__name__, {
    "ChatCompletion": "openai.types.chat.chat_completion",
    "Completion": "openai.types.completion",
    "BaseModel": "pydantic",
    "Field": "pydantic",
})

__all__ = [
    "APIServer",
    "APIServerConfig",
    "AsyncSemWithAdaptiveWeight",
    "InferenceClient",
    "InferenceError",
    "OpenaiConfig",
    "ReasoningConfig",
    "VALID_REASONING_EFFORTS",
    "ServerBaseline",
    "is_transient_error",
]


def merge_choices(results: list[Any]) -> Any:
    """Merge the ``choices`` of several OpenAI responses into the first one, re-indexed 0..n-1.

    Used when one request for ``n`` completions was split into several (chunks of a large ``n``,
    or one request per completion for servers that ignore ``n``).

    Args:
        results: ChatCompletion or Completion objects, at least one.

    Returns:
        ``results[0]`` with the choices of all of them, in order.
    """
    merged = results[0]
    if len(results) == 1:
        return merged
    choices = [choice for result in results for choice in result.choices]
    for index, choice in enumerate(choices):
        choice.index = index
    merged.choices = choices
    return merged
