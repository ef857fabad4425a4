"""``SGLangClient``: the ``InferenceClient`` backend for an SGLang server.

* chat and text completions: SGLang's OpenAI-compatible ``/v1`` routes, through the ``openai``
  client (inherited from :class:`OpenAIClient`);
* ``tokens_and_logprobs_completion``: SGLang's native ``POST {root}/generate`` with
  ``input_ids``, ``sampling_params`` and ``return_logprob=true``; the sampled ids and their
  log-probs come from ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]``
  triples), so ``ManagedServer`` works exactly as with vLLM;
* health: ``GET {root}/health`` (free: no completion is sent).
"""

from __future__ import annotations

import logging
from typing import Any

from atroposlib.errors import InferenceError
from atroposlib.inference.clients.config import APIServerConfig, ReasoningConfig, ServerBaseline
from atroposlib.inference.clients.openai_client import OpenAIClient
from atroposlib.inference.clients.vllm_client import bearer_headers, require_base_url, root_url

logger = logging.getLogger(__name__)

#: Request keys that are not SGLang sampling parameters.
_NOT_SAMPLING = ("prompt", "input_ids", "messages", "model", "logprobs", "stream", "extra_body")
#: OpenAI-style names -> SGLang sampling-parameter names.
_RENAMES = {
    "max_tokens": "max_new_tokens",
    "max_completion_tokens": "max_new_tokens",
    "stop_token_ids": "stop_token_ids",
}


def finish_reason_of(meta_info: dict[str, Any]) -> str:
    """SGLang's ``finish_reason`` (``{"type": "stop"|"length"|"abort", ...}`` or a string)."""
    raw = meta_info.get("finish_reason")
    if isinstance(raw, dict):
        raw = raw.get("type")
    return str(raw or "stop")


class SGLangClient(OpenAIClient):
    """Backend for SGLang (``server_type="sglang"``): OpenAI routes + native ``/generate``."""

    def __init__(
        self,
        config: APIServerConfig | ServerBaseline,
        reasoning_config: ReasoningConfig | None = None,
    ):
        """Create the clients (no request is sent until the first call).

        Args:
            config: endpoint settings; ``base_url`` like ``http://127.0.0.1:30000/v1``.
            reasoning_config: reasoning options for chat completions, or None.

        Raises:
            ValueError: no ``base_url`` (SGLang is always self-hosted).
        """
        base_url = require_base_url(config, "sglang", "e.g. --openai.base_url http://127.0.0.1:30000/v1")
        super().__init__(config, reasoning_config)
        import httpx

        self.http = httpx.AsyncClient(
            base_url=root_url(base_url), headers=bearer_headers(config.api_key), timeout=config.timeout
        )


    async def _check_health(self) -> bool:
        """``GET {root}/health``."""
        return (await self.http.get("/health", timeout=10.0)).status_code == 200

    async def aclose(self) -> None:
        """Stop health checks and close both HTTP clients."""
        await super().aclose()
        await self.http.aclose()

    async def _tokens_and_logprobs_completion_wrapper(
        self, **kwargs: Any
    ) -> tuple[list[int], list[list[int]], list[list[float]], list[str]]:
        """Generate from token ids via ``POST /generate``; see ``InferenceClient``.

        Raises:
            ValueError: neither ``input_ids`` nor a string ``prompt``.
            InferenceError: the answer lacks ``meta_info.output_token_logprobs`` or has the
                wrong number of outputs.
            httpx.HTTPStatusError: a non-2xx answer (retried by the base when transient).
        """
        input_ids = kwargs.get("input_ids")
        if input_ids is None:
            prompt = kwargs.get("prompt")
            if not isinstance(prompt, str):
                raise ValueError(
                    "tokens_and_logprobs_completion needs input_ids=[int, ...] or prompt=str"
                )
            input_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        input_ids = [int(t) for t in input_ids]
        sampling = {
            _RENAMES.get(k, k): v
            for k, v in kwargs.items()
            if k not in _NOT_SAMPLING and v is not None
        }
        n = int(sampling.get("n", 1) or 1)
        body = {
            "input_ids": input_ids,
            "sampling_params": sampling,
            "return_logprob": True,
            "return_text_in_logprobs": False,
        }
        response = await self.http.post("/generate", json=body)
        response.raise_for_status()
        results = response.json()
        results = results if isinstance(results, list) else [results]
        if len(results) != n:
            raise InferenceError(f"{self.name} returned {len(results)} outputs for n={n}")
        outputs, logprobs, reasons = [], [], []
        for result in results:
            meta = result.get("meta_info") or {}
            triples = meta.get("output_token_logprobs")
            if triples is None:
                raise InferenceError(
                    f"{self.name} /generate answered without meta_info.output_token_logprobs; "
                    "is it an SGLang server?"
                )
            outputs.append([int(t[1]) for t in triples])
            logprobs.append([float(t[0]) if t[0] is not None else -9999.0 for t in triples])
            reasons.append(finish_reason_of(meta))
        return input_ids, outputs, logprobs, reasons


# Atropos 0.4 also exposed the server-config resolver from this module.
from atroposlib.inference.clients.openai_client import resolve_openai_configs  # noqa: E402

#: Atropos 0.4's name for :class:`SGLangClient`.
SGLangServer = SGLangClient


__all__ = ["SGLangClient", "SGLangServer", "finish_reason_of", "resolve_openai_configs"]
