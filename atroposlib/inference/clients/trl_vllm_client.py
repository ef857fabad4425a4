"""``TrlVllmClient``: the ``InferenceClient`` backend for ``trl vllm-serve``.

TRL's server has one generation route, ``POST {root}/generate/``, taking text prompts and
returning ``completion_ids``. Chat requests are rendered with the tokenizer's chat template here;
completions are decoded locally. ``finish_reason`` is ``"stop"`` when the EOS token was sampled,
else ``"length"``. TRL returns no per-token log-probs, so ``tokens_and_logprobs_completion`` is
not available (use ``server_type="vllm"`` for managed mode). Health: ``GET {root}/health/``.

As in Atropos 0.4, requests go through this module's ``aiohttp`` (an ``aiohttp.ClientSession``
per server) and the tokenizer is loaded with this module's ``AutoTokenizer``, so code that
patches those two names here (Atropos 0.4's own tests do) patches what runs. Without aiohttp
installed (it comes with the ``envs`` extra), the same requests go through httpx.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from typing import Any

try:  # Atropos 0.4's TRL client posts with aiohttp; keep the name here, where callers patch it
    import aiohttp
except ImportError:  # pragma: no cover - depends on the install; httpx does the same requests
    aiohttp = None

from atroposlib.errors import InferenceError
from atroposlib.inference.clients.base import InferenceClient
from atroposlib.inference.clients.config import APIServerConfig, ReasoningConfig, ServerBaseline
from atroposlib.inference.clients.vllm_client import require_base_url, root_url

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
        """Set up the client (no request is sent and no tokenizer loaded until the first call).

        Args:
            config: endpoint settings; ``base_url`` is the TRL server root, e.g.
                ``http://127.0.0.1:8000`` (a trailing ``/v1`` is ignored); ``tokenizer_name``
                (or ``model_name``) gives the chat template and the decoder.
            reasoning_config: accepted for interface compatibility (TRL has no reasoning API).

        Raises:
            ValueError: no ``base_url``.
        """
        base_url = require_base_url(
            config, "trl", "the `trl vllm-serve` address, e.g. --openai.base_url http://127.0.0.1:8000"
        )
        super().__init__(config, reasoning_config)
        self.root_url = root_url(base_url)
        #: The aiohttp session (made on the first request, inside the running event loop).
        self.session: Any = None
        #: The httpx client, used when aiohttp is not installed (tests may set their own).
        self.http: Any = None
        if aiohttp is None:
            import httpx

            self.http = httpx.AsyncClient(base_url=self.root_url, timeout=config.timeout)

    @property
    def tokenizer(self) -> Any:
        """The tokenizer of ``tokenizer_name`` (``model_name`` if "none"), loaded on first use.

        Loaded through this module's ``AutoTokenizer`` (see the module docstring).
        """
        if self._tokenizer is None:
            from atroposlib.utils.hf_tokenizer import load_tokenizer

            name = self.config.tokenizer_name
            if not name or name == "none":
                name = self.config.model_name
            auto = sys.modules[__name__].AutoTokenizer  # a patched name, or transformers'
            self._tokenizer = load_tokenizer(name, auto_tokenizer=auto)
        return self._tokenizer

    def _session(self) -> Any:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.config.timeout), raise_for_status=True
            )
        return self.session

    async def _post_json(self, path: str, body: dict[str, Any]) -> Any:
        """POST ``body`` to ``{root}{path}``; return the decoded JSON answer.

        Raises:
            aiohttp.ClientResponseError | httpx.HTTPStatusError: a 4xx/5xx answer.
        """
        if self.http is not None:
            response = await self.http.post(path, json=body)
            response.raise_for_status()
            return response.json()
        async with self._session().post(self.root_url + path, json=body) as response:
            return await response.json()

    async def _check_health(self) -> bool:
        """``GET {root}/health/``."""
        if self.http is not None:
            return (await self.http.get("/health/", timeout=10.0)).status_code == 200
        try:
            async with self._session().get(
                self.root_url + "/health/", timeout=aiohttp.ClientTimeout(total=10.0)
            ) as response:
                return response.status == 200
        except aiohttp.ClientResponseError:
            return False

    async def aclose(self) -> None:
        """Stop health checks and close the HTTP session."""
        await super().aclose()
        if self.session is not None:
            await self.session.close()
            self.session = None
        if self.http is not None:
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
        completion_ids = (await self._post_json("/generate/", body)).get("completion_ids")
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


__all__ = ["TRL_DEFAULTS", "TrlVllmClient", "TrlVllmServer"]
