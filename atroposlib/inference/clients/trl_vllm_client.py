"""``TrlVllmClient``: the ``InferenceClient`` backend for ``trl vllm-serve``.

TRL's server has one generation route, ``POST {root}/generate/``, taking text prompts and
returning ``completion_ids``. Chat requests are rendered with the tokenizer's chat template here;
completions are decoded locally. ``finish_reason`` is ``"stop"`` when the EOS token was sampled,
else ``"length"``. TRL returns no per-token log-probs, so ``tokens_and_logprobs_completion`` is
not available (use ``server_type="vllm"`` for managed mode). Health: ``GET {root}/health/``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from atroposlib.errors import InferenceError
from atroposlib.inference.clients.base import InferenceClient
from atroposlib.inference.clients.config import APIServerConfig, ReasoningConfig, ServerBaseline
from atroposlib.inference.clients.vllm_client import root_url
from atroposlib.utils.lazy_exports import lazy_exports

#: Sampling defaults sent to TRL (its request model requires them all).
TRL_DEFAULTS: dict[str, Any] = {
    "n": 1,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "max_tokens": 1024,
}


class TrlVllmClient(InferenceClient):
    """Backend for ``trl vllm-serve`` (``server_type="trl"``); no token log-probs."""

    def __init__(
        self,
        config: APIServerConfig | ServerBaseline,
        reasoning_config: ReasoningConfig | None = None,
    ):
        """Create the HTTP client (no request is sent until the first call).

        Args:
            config: endpoint settings; ``base_url`` is the TRL server root, e.g.
                ``http://127.0.0.1:8000`` (a trailing ``/v1`` is ignored); ``tokenizer_name``
                (or ``model_name``) gives the chat template and the decoder.
            reasoning_config: accepted for interface compatibility (TRL has no reasoning API).

        Raises:
            ValueError: no ``base_url``.
        """
        if not getattr(config, "base_url", None):
            raise ValueError(
                "server_type 'trl' needs base_url, the `trl vllm-serve` address, e.g. "
                "--openai.base_url http://127.0.0.1:8000"
            )
        super().__init__(config, reasoning_config)
        import httpx

        self.http = httpx.AsyncClient(base_url=root_url(config.base_url), timeout=config.timeout)


    async def _check_health(self) -> bool:
        """``GET {root}/health/``."""
        return (await self.http.get("/health/", timeout=10.0)).status_code == 200

    async def aclose(self) -> None:
        """Stop health checks and close the HTTP client."""
        await super().aclose()
        await self.http.aclose()

    async def _generate(self, prompt: str, kwargs: dict[str, Any]) -> list[tuple[str, str]]:
        """POST one prompt to ``/generate/``; return ``[(text, finish_reason)] * n``."""
        body = dict(TRL_DEFAULTS)
        for key in TRL_DEFAULTS:
            if kwargs.get(key) is not None:
                body[key] = kwargs[key]
        if kwargs.get("max_completion_tokens") is not None:
            body["max_tokens"] = kwargs["max_completion_tokens"]
        body["prompts"] = [prompt]
        response = await self.http.post("/generate/", json=body)
        response.raise_for_status()
        completion_ids = response.json().get("completion_ids")
        if completion_ids is None or len(completion_ids) != body["n"]:
            raise InferenceError(
                f"{self.name} /generate/ returned {completion_ids!r:.200} for n={body['n']}; "
                "is it `trl vllm-serve`?"
            )
        eos = self.tokenizer.eos_token_id
        return [
            (
                self.tokenizer.decode(ids, skip_special_tokens=True),
                "stop" if eos is not None and eos in ids else "length",
            )
            for ids in completion_ids
        ]

    async def _chat_completion_wrapper(self, **kwargs: Any) -> Any:
        from openai.types.chat import ChatCompletion, ChatCompletionMessage
        from openai.types.chat.chat_completion import Choice

        messages = kwargs.get("messages")
        if not messages:
            raise ValueError("chat_completion needs a non-empty `messages` list")
        prompt = await asyncio.to_thread(
            self.tokenizer.apply_chat_template, messages, tokenize=False, add_generation_prompt=True
        )
        results = await self._generate(prompt, kwargs)
        return ChatCompletion(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=str(kwargs.get("model") or self.config.model_name),
            object="chat.completion",
            choices=[
                Choice(
                    index=i,
                    message=ChatCompletionMessage(role="assistant", content=text),
                    finish_reason=reason,
                )
                for i, (text, reason) in enumerate(results)
            ],
        )

    async def _completion_wrapper(self, **kwargs: Any) -> Any:
        from openai.types import Completion, CompletionChoice

        prompt = kwargs.get("prompt")
        if not isinstance(prompt, str):
            raise ValueError("completion needs `prompt` as a string for server_type 'trl'")
        results = await self._generate(prompt, kwargs)
        return Completion(
            id=f"cmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=str(kwargs.get("model") or self.config.model_name),
            object="text_completion",
            choices=[
                CompletionChoice(index=i, text=text, finish_reason=reason)
                for i, (text, reason) in enumerate(results)
            ],
        )


#: Atropos 0.4's name for :class:`TrlVllmClient`.
TrlVllmServer = TrlVllmClient

# Names Atropos 0.4's envs.server_handling.trl_vllm_server imported at module level (third-party types and sibling classes);
# resolved from their homes on first access, so importing this module stays as cheap as before.
__getattr__ = lazy_exports(__name__, {
    "APIServer": "atroposlib.inference.clients.base",
    "AutoTokenizer": "transformers",
    "ChatCompletion": "openai.types.chat.chat_completion",
    "ChatCompletionMessage": "openai.types.chat.chat_completion",
    "Choice": "openai.types.chat.chat_completion",
    "Completion": "openai.types.completion",
    "CompletionChoice": "openai.types.completion",
})

__all__ = ["TRL_DEFAULTS", "TrlVllmClient", "TrlVllmServer"]
