"""``OpenAIServer``: an ``APIServer`` backend for any OpenAI-compatible chat/completion endpoint.

Health is checked with ``GET {base_url}/models`` (free), never with a paid completion. When a
server ignores ``n`` (returns one choice), the request is fanned out into ``n`` parallel
single-choice requests and merged; with ``n == 1`` exactly one request is made.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    ReasoningConfig,
    ServerBaseline,
    merge_choices,
)
from atroposlib.errors import InferenceError

logger = logging.getLogger(__name__)


class OpenAIServer(APIServer):
    """OpenAI-compatible backend built on ``openai.AsyncOpenAI``.

    It cannot return exact token ids with log-probs (``tokens_and_logprobs_completion`` raises
    NotImplementedError); use ``server_type="vllm"`` for managed mode.
    """

    def __init__(
        self,
        config: APIServerConfig | ServerBaseline,
        reasoning_config: ReasoningConfig | None = None,
    ):
        """Create the client (no request is sent until the first call).

        Args:
            config: endpoint settings; ``base_url`` "" or None means the official OpenAI API.
            reasoning_config: reasoning options for chat completions, or None.
        """
        super().__init__(config, reasoning_config)
        import openai

        base_url = getattr(config, "base_url", None) or None
        api_key = getattr(config, "api_key", None) or "EMPTY"
        self.openai = openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, timeout=config.timeout, max_retries=0
        )

    async def _check_health(self) -> bool:
        """``GET {base_url}/models``: cheap and free on every OpenAI-compatible server."""
        await self.openai.models.list()
        return True

    async def aclose(self) -> None:
        """Stop health checks and close the HTTP client."""
        await super().aclose()
        await self.openai.close()

    async def _fan_out(self, create: Any, kwargs: dict[str, Any]) -> Any:
        """Send ``n`` single-choice requests in parallel and merge their choices."""
        n = int(kwargs.get("n", 1) or 1)
        single = {**kwargs, "n": 1}
        return merge_choices(await asyncio.gather(*(create(**single) for _ in range(n))))

    async def _request_n(self, create: Any, kwargs: dict[str, Any]) -> Any:
        n = int(kwargs.get("n", 1) or 1)
        if n > 1 and self.config.n_kwarg_is_ignored:
            return await self._fan_out(create, kwargs)
        result = await create(**kwargs)
        got = len(result.choices)
        if got == n:
            return result
        if got == 1 and n > 1:
            logger.warning(
                "%s returned 1 choice for n=%d: it ignores `n`; fanning out from now on "
                "(set n_kwarg_is_ignored=True to skip this probe)",
                self.name,
                n,
            )
            self.config.n_kwarg_is_ignored = True
            rest = await self._fan_out(create, {**kwargs, "n": n - 1})
            result.choices = list(result.choices) + list(rest.choices)
            for index, choice in enumerate(result.choices):
                choice.index = index
            return result
        raise InferenceError(f"{self.name} returned {got} choices for n={n}")

    async def _chat_completion_wrapper(self, **kwargs: Any) -> Any:
        return await self._request_n(self.openai.chat.completions.create, kwargs)

    async def _completion_wrapper(self, **kwargs: Any) -> Any:
        return await self._request_n(self.openai.completions.create, kwargs)


__all__ = ["OpenAIServer"]
