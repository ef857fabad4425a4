"""The inference-backend contract: the ``InferenceClient`` ABC and its request path.

One :class:`InferenceClient` exists per inference endpoint (vLLM, SGLang, OpenAI, TRL, or an
in-process fake). The base class owns everything that is the same for every backend:

* two adaptive semaphores (``sem`` for training, ``eval_sem`` for evaluation;
  :mod:`.semaphore`);
* health gating (:mod:`.health`): a cheap background health check (never a paid completion),
  and a bounded wait for health before each request (``config.timeout`` seconds, then
  :class:`~atroposlib.errors.InferenceUnavailableError`);
* tenacity retries, applied ONCE per request (3 attempts, random-exponential backoff), only on
  transient failures (connection errors, timeouts, 429, 5xx);
* bounded timing/attempt metrics (``rolling_buffer_length``) and ``wandb_metrics()``
  (:mod:`.request_metrics`);
* reasoning-kwargs injection for chat completions (:class:`ReasoningConfig`, with the
  server settings models in :mod:`atroposlib.inference.clients.config`).

Subclasses implement only ``_chat_completion_wrapper``, ``_completion_wrapper`` and, when the
backend can return exact token ids and sampler log-probs, ``_tokens_and_logprobs_completion_wrapper``
(and optionally ``_check_health`` and ``_get_logprobs_wrapper``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
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
from atroposlib.inference.clients.health import HealthGate
from atroposlib.inference.clients.request_metrics import RequestMetrics
from atroposlib.inference.clients.semaphore import AsyncSemWithAdaptiveWeight
from atroposlib.inference.policy_version import record_served_version

logger = logging.getLogger(__name__)

#: Attempts per request (including the first) for transient failures.
REQUEST_ATTEMPTS = 3


def http_status(exc: BaseException) -> int | None:
    """The HTTP status behind an openai-python or httpx error, or None when it has none."""
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def is_refused_request(exc: BaseException) -> bool:
    """True when the server answered 4xx other than 408/409/429: resending the same request fails again.

    Such a refusal usually means a configuration problem (a wrong model name, image parts sent to
    a text-only model, ``max_tokens`` beyond the context window), not a bad rollout.
    """
    status = http_status(exc)
    return status is not None and 400 <= status < 500 and status not in (408, 409, 429)


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
    status = http_status(exc)
    if status is not None:
        return status in (408, 409, 429) or status >= 500
    try:
        import openai
    except ImportError:  # pragma: no cover - openai is a core dependency
        return False
    return isinstance(exc, (openai.APIConnectionError, openai.APITimeoutError))


class InferenceClient(HealthGate, RequestMetrics, ABC):
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
        self._init_health_gate()
        self._init_request_metrics(config.rolling_buffer_length)
        self._tokenizer: Any = None
        self.in_flight = 0
        #: The policy version (trainer step) this server last reported serving (an
        #: atropos-inference-node tags every completion with it); None: never reported.
        self.policy_version: int | None = None

    def note_policy_version(self, version: int, served: bool = True) -> None:
        """Remember the policy version the server reported.

        Args:
            version: the version from a response header or a status probe.
            served: a completion of the current rollout was served with it: also credit it to
                the rollout (:func:`~atroposlib.inference.policy_version.record_served_version`).
        """
        self.policy_version = version
        if served:
            record_served_version(version)

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

    @property
    def name(self) -> str:
        """A short label for logs and metrics: the base URL, else the model name."""
        return getattr(self.config, "base_url", None) or self.config.model_name

    def update_weight(self, weight: float) -> None:
        """Scale both semaphores to ``weight`` of their size (the API's ``env_weight``)."""
        self.sem.update_weight(weight)
        self.eval_sem.update_weight(weight)

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
                            self.note_request_error(exc)
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
    "actual_token_logprob",
    "http_status",
    "is_refused_request",
    "is_transient_error",
]


def actual_token_logprob(result: Mapping[str, Any], position: int, token: int) -> float | None:
    """The log-probability (nats, <= 0) that a ``get_logprobs`` answer gives ``token`` at ``position``.

    vLLM ranks the top ``k`` candidates at each prompt position and adds the prompt's actual token
    when it falls outside them, so the actual token is normally among the candidates whatever
    ``top_k`` was asked; other backends may leave it out.

    Args:
        result: a :meth:`InferenceClient.get_logprobs` answer, ``{"prompt_topk_token_ids":
            [P][<=k+1], "prompt_topk_logprobs": [P][<=k+1], ...}``.
        position: index into the scored sequence (``0 <= position < P``).
        token: the token id that sits at ``position`` in the scored sequence.

    Returns:
        The candidate's log-prob, or None when ``token`` is not among the candidates at
        ``position`` (position 0 has none: nothing precedes it).

    Raises:
        IndexError: ``position`` is past the end of the answer.
    """
    ranked = [int(t) for t in (result["prompt_topk_token_ids"][position] or [])]
    try:
        index = ranked.index(int(token))
    except ValueError:
        return None
    return float(result["prompt_topk_logprobs"][position][index])


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
