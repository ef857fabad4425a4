"""``VLLMClient``: the ``InferenceClient`` backend for STOCK vLLM's OpenAI-compatible server.

No custom vLLM server with a ``/generate`` route is needed: stock
``vllm serve`` (or :class:`~atroposlib.inference.vllm_process.VLLMProcess`) gives everything
through ``/v1/completions``:

* chat and text completions go through the ``openai`` client (``n`` is native in vLLM);
* ``tokens_and_logprobs_completion`` sends the prompt as TOKEN IDS (``prompt=[ids]``) with
  ``logprobs=0`` and ``return_tokens_as_token_ids=true``, so each sampled token comes back as
  ``"token_id:<id>"`` with the sampler's log-prob: exact ids, never re-tokenised text. This is
  what ``ManagedServer`` builds tokens / masks / ``inference_logprobs`` from;
* ``get_logprobs`` uses vLLM's ``prompt_logprobs`` extension;
* health is ``GET {root}/health`` (``base_url`` without ``/v1``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from atroposlib.errors import InferenceError
from atroposlib.inference.clients.config import APIServerConfig, ReasoningConfig, ServerBaseline
from atroposlib.inference.clients.openai_client import OpenAIClient

logger = logging.getLogger(__name__)

#: vLLM sampling parameters that the ``openai`` client does not know; sent in ``extra_body``.
VLLM_EXTRA_PARAMS = frozenset(
    {
        "top_k",
        "min_p",
        "repetition_penalty",
        "length_penalty",
        "min_tokens",
        "stop_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "truncate_prompt_tokens",
        "prompt_logprobs",
        "allowed_token_ids",
        "bad_words",
        "structured_outputs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "priority",
        "cache_salt",
    }
)
#: Keys that only make sense for one call style and are dropped before a token-level request.
_NOT_SAMPLING = ("prompt", "input_ids", "messages", "logprobs", "echo", "stream", "tools")


def root_url(base_url: str) -> str:
    """Return the server root of an OpenAI ``base_url`` (``http://h:p/v1`` -> ``http://h:p``)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def require_base_url(config: APIServerConfig | ServerBaseline, server_type: str, hint: str) -> str:
    """Return ``config.base_url`` of a self-hosted backend (vLLM, SGLang, TRL), which must have one.

    Args:
        config: the endpoint settings.
        server_type: the backend's ``server_type``, named in the error.
        hint: what to pass instead, appended to the error (an example address).

    Raises:
        ValueError: ``config`` has no (or an empty) ``base_url``.
    """
    base_url = getattr(config, "base_url", None)
    if not base_url:
        raise ValueError(f"server_type '{server_type}' needs base_url, {hint}")
    return base_url


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """``{"Authorization": "Bearer <api_key>"}``, or no headers without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def parse_token_id(token: str) -> int:
    """Parse vLLM's ``return_tokens_as_token_ids`` token string ``"token_id:123"`` -> ``123``.

    Raises:
        InferenceError: the string is not in that form (the server ignored the option: it is
            not vLLM, or too old).
    """
    prefix, _, number = token.partition(":")
    if prefix != "token_id" or not number.lstrip("-").isdigit():
        raise InferenceError(
            f"expected a 'token_id:<int>' token from vLLM, got {token!r}; the server does not "
            "support return_tokens_as_token_ids (use a recent stock vLLM, or server_type "
            "'openai' without managed mode)"
        )
    return int(number)


def _finite(logprob: Any) -> float:
    """Map a missing or infinite log-prob (impossible token) to -9999.0 for JSON and the trainer."""
    if logprob is None:
        return -9999.0
    value = float(logprob)
    return value if math.isfinite(value) else -9999.0


class VLLMClient(OpenAIClient):
    """Backend for a stock vLLM OpenAI-compatible server (``server_type="vllm"``).

    Adds exact token ids + sampler log-probs (``tokens_and_logprobs_completion``), prompt
    log-probs (``get_logprobs``) and a ``/health`` probe to :class:`OpenAIClient`.
    """

    def __init__(
        self,
        config: APIServerConfig | ServerBaseline,
        reasoning_config: ReasoningConfig | None = None,
    ):
        """Create the client (no request is sent until the first call).

        Args:
            config: endpoint settings; ``base_url`` like ``http://127.0.0.1:9001/v1``.
                ``tokenizer_name`` (or ``model_name`` when it is ``"none"``) is loaded only if a
                call passes a text ``prompt`` without ``input_ids``.
            reasoning_config: reasoning options for chat completions, or None.

        Raises:
            ValueError: no ``base_url`` (vLLM is always self-hosted).
        """
        require_base_url(
            config, "vllm",
            "e.g. --openai.base_url http://127.0.0.1:9001/v1 (the vLLM server's OpenAI address)",
        )
        super().__init__(config, reasoning_config)
        self._http: Any = None  # httpx.AsyncClient for /health, created on first use
        self._is_node: bool | None = None  # an atropos-inference-node? (None: not probed yet)


    async def _check_health(self) -> bool:
        """``GET {root}/health`` (200 once the engine is ready), with the bearer key if set.

        On an ``atropos-inference-node`` also ``GET /atropos/status``: healthy only while it
        serves weights (not while it awaits them after a restart, or after a failed update),
        and its policy version is noted, so the manager can route around a node that lags.
        """
        import httpx

        if self._http is None:
            self._http = httpx.AsyncClient(headers=bearer_headers(self.config.api_key), timeout=10.0)
        root = root_url(self.config.base_url)
        response = await self._http.get(f"{root}/health")
        if response.status_code != 200 or self._is_node is False:
            return response.status_code == 200
        status = await self._http.get(f"{root}/atropos/status")
        if status.status_code == 404:  # a plain vLLM
            self._is_node = False
            return True
        if status.status_code != 200:
            logger.warning("inference node %s answered /atropos/status with %d; check its API key "
                           "(--openai.api_key)", self.name, status.status_code)
            return False
        self._is_node = True
        body = status.json()
        if body.get("policy_version") is not None:
            self.note_policy_version(int(body["policy_version"]), served=False)
        return body.get("state") in ("serving", "applying")

    async def aclose(self) -> None:
        """Stop health checks and close the HTTP clients."""
        await super().aclose()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # ------------------------------------------------------------------ request building
    @staticmethod
    def _split_extra(kwargs: dict[str, Any]) -> dict[str, Any]:
        """Move vLLM-only sampling parameters into ``extra_body`` (the openai client rejects them)."""
        extra = dict(kwargs.pop("extra_body", None) or {})
        for key in list(kwargs):
            if key in VLLM_EXTRA_PARAMS:
                extra[key] = kwargs.pop(key)
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    async def _chat_completion_wrapper(self, **kwargs: Any) -> Any:
        return await super()._chat_completion_wrapper(**self._split_extra(dict(kwargs)))

    async def _completion_wrapper(self, **kwargs: Any) -> Any:
        return await super()._completion_wrapper(**self._split_extra(dict(kwargs)))

    def _prompt_ids(self, kwargs: dict[str, Any]) -> list[int]:
        """Token ids of the prompt: ``input_ids`` as given, else the encoded ``prompt``.

        A duplicated leading BOS (template BOS + tokenizer BOS) is reduced to one.

        Raises:
            ValueError: neither ``input_ids`` nor a string ``prompt`` was given.
        """
        input_ids = kwargs.get("input_ids")
        if input_ids is None:
            prompt = kwargs.get("prompt")
            if not isinstance(prompt, str):
                raise ValueError(
                    "tokens_and_logprobs_completion needs input_ids=[int, ...] or prompt=str"
                )
            input_ids = self.tokenizer.encode(prompt)
            bos = getattr(self.tokenizer, "bos_token_id", None)
            if bos is not None and len(input_ids) >= 2 and input_ids[0] == input_ids[1] == bos:
                input_ids = input_ids[1:]
        ids = [int(t) for t in input_ids]
        if not ids:
            raise ValueError("tokens_and_logprobs_completion got an empty prompt")
        return ids

    @staticmethod
    def _sampling_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
        sampling = {k: v for k, v in kwargs.items() if k not in _NOT_SAMPLING}
        for alias in ("max_new_tokens", "max_completion_tokens"):
            if alias in sampling:
                value = sampling.pop(alias)
                sampling.setdefault("max_tokens", value)
        return sampling

    async def _tokens_and_logprobs_completion_wrapper(
        self, **kwargs: Any
    ) -> tuple[list[int], list[list[int]], list[list[float]], list[str]]:
        """Generate from exact token ids; see ``InferenceClient.tokens_and_logprobs_completion``.

        Returns:
            ``(prompt_tokens [P], output_tokens [n][T_k], output_logprobs [n][T_k],
            finish_reasons [n])``. ``output_tokens`` include a sampled EOS; tokens of a matched
            stop string are included too (the text vLLM returns omits them).

        Raises:
            InferenceError: the answer lacks token ids / log-probs or has the wrong choice count.
        """
        prompt_ids = self._prompt_ids(kwargs)
        sampling = self._split_extra(self._sampling_kwargs(kwargs))
        extra = dict(sampling.pop("extra_body", None) or {})
        extra["return_tokens_as_token_ids"] = True
        n = int(sampling.get("n", 1) or 1)
        result = await self.openai.completions.create(
            prompt=prompt_ids, logprobs=0, extra_body=extra, **sampling
        )
        choices = sorted(result.choices, key=lambda c: c.index)
        if len(choices) != n:
            raise InferenceError(f"{self.name} returned {len(choices)} choices for n={n}")
        outputs, logprobs, reasons = [], [], []
        for choice in choices:
            lp = choice.logprobs
            if lp is None or lp.tokens is None or lp.token_logprobs is None:
                raise InferenceError(
                    f"{self.name} returned no token log-probs; is it a vLLM server? "
                    "(server_type 'vllm' needs /v1/completions with logprobs support)"
                )
            outputs.append([parse_token_id(t) for t in lp.tokens])
            logprobs.append([_finite(x) for x in lp.token_logprobs])
            reasons.append(choice.finish_reason or "stop")
        return prompt_ids, outputs, logprobs, reasons

    async def _get_logprobs_wrapper(self, **kwargs: Any) -> dict[str, Any]:
        """Prompt log-probs via vLLM's ``prompt_logprobs`` (top ``top_k``, default 1; 0 = actual token).

        Returns:
            ``{"prompt_tokens": [P], "prompt_topk_token_ids": [P][<=k+1],
            "prompt_topk_logprobs": [P][<=k+1]}``, each position sorted by rank (the actual
            prompt token is included even outside the top k); position 0 has empty lists.
        """
        prompt_ids = self._prompt_ids(kwargs)
        top_k = kwargs.pop("top_k", None)
        if top_k is None:
            top_k = kwargs.pop("prompt_logprobs", None)
        # 0 is valid: vLLM then returns only the actual prompt token's log-prob at each position
        top_k = 1 if top_k is None else int(top_k)
        sampling = self._sampling_kwargs(kwargs)
        sampling.update(n=1, temperature=0.0, top_p=1.0)
        sampling.setdefault("max_tokens", 1)
        extra = dict(sampling.pop("extra_body", None) or {})
        extra["prompt_logprobs"] = top_k
        result = await self.openai.completions.create(
            prompt=prompt_ids, extra_body=extra, **sampling
        )
        raw = getattr(result.choices[0], "prompt_logprobs", None)
        if raw is None:
            raw = (result.choices[0].model_extra or {}).get("prompt_logprobs")
        if raw is None:
            raise InferenceError(f"{self.name} returned no prompt_logprobs")
        ids_out: list[list[int]] = []
        lps_out: list[list[float]] = []
        for entry in raw:
            ranked = sorted(
                ((int(tid), info) for tid, info in (entry or {}).items()),
                key=lambda kv: kv[1].get("rank", 0) if isinstance(kv[1], dict) else 0,
            )
            ids_out.append([tid for tid, _ in ranked])
            lps_out.append(
                [_finite(info["logprob"] if isinstance(info, dict) else info) for _, info in ranked]
            )
        return {
            "prompt_tokens": prompt_ids,
            "prompt_topk_token_ids": ids_out,
            "prompt_topk_logprobs": lps_out,
        }


# Atropos 0.4 also exposed the server-config resolver from this module.
from atroposlib.inference.clients.openai_client import resolve_openai_configs  # noqa: E402

#: Atropos 0.4's name for :class:`VLLMClient`.
VLLMServer = VLLMClient


__all__ = [
    "VLLMClient", "VLLMServer", "bearer_headers", "parse_token_id", "require_base_url",
    "resolve_openai_configs", "root_url",
]
