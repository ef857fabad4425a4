"""``OpenAIClient``: an ``InferenceClient`` backend for any OpenAI-compatible chat/completion endpoint.

Health is checked with ``GET {base_url}/models`` (free), never with a paid completion. When a
server ignores ``n`` (returns one choice), the request is fanned out into ``n`` parallel
single-choice requests and merged; with ``n == 1`` exactly one request is made.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from atroposlib.errors import InferenceError
from atroposlib.inference.clients.base import InferenceClient, merge_choices
from atroposlib.inference.clients.config import APIServerConfig, ReasoningConfig, ServerBaseline
from atroposlib.inference.policy_version import parse_policy_version

logger = logging.getLogger(__name__)


class OpenAIClient(InferenceClient):
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
        # the response hook reads the policy version an inference node tags each answer with
        self.openai = openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url, timeout=config.timeout, max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(event_hooks={"response": [self._on_response]}),
        )

    async def _on_response(self, response: Any) -> None:
        """Note the ``X-Atropos-Policy-Version`` of a response (an httpx hook, run in the caller's task)."""
        version = parse_policy_version(response.headers)
        if version is not None:
            self.note_policy_version(version)

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


def resolve_openai_configs(
    default_server_configs: Any,
    openai_config_dict: Mapping[str, Any] | None,
    yaml_config: Mapping[str, Any] | None,
    cli_passed_flags: Mapping[str, Any] | None,
    logger: logging.Logger | None = None,
) -> Any:
    """Merge inference-server configs: defaults < YAML ``openai:`` < ``--openai.*`` flags.

    The Atropos 0.4 helper signature over the env CLI's resolver (one server stays a list of
    one config, several come from a YAML ``openai:`` list, flags cannot edit several).

    Args:
        default_server_configs: what the env's ``config_init`` returned for its servers.
        openai_config_dict: the merged ``openai`` values; its keys that were passed as
            ``openai.<key>`` flags are the flag values used (the rest is ignored).
        yaml_config: the whole YAML mapping (its ``openai`` key is read).
        cli_passed_flags: flags given on the command line, keyed ``"openai.<field>"``.
        logger: unused (kept for the call signature).

    Returns:
        A list of ``APIServerConfig`` / ``InferenceClient``, or a bare ``ServerBaseline``.

    Raises:
        ConfigError: flags combined with several servers, or invalid values.
    """
    from atroposlib.inference.clients.resolve import resolve_server_configs

    merged = dict(openai_config_dict or {})
    cli = {
        key.split(".", 1)[1]: merged.get(key.split(".", 1)[1], value)
        for key, value in (cli_passed_flags or {}).items()
        if key.startswith("openai.")
    }
    return resolve_server_configs(default_server_configs, (yaml_config or {}).get("openai"), cli)


#: Atropos 0.4's name for :class:`OpenAIClient`.
OpenAIServer = OpenAIClient


__all__ = ["OpenAIClient", "OpenAIServer", "resolve_openai_configs"]
