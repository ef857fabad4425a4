"""Inference server settings: ``ServerBaseline``, ``APIServerConfig`` and ``ReasoningConfig``.

The pydantic models an env's ``config_init`` returns and ``--openai.*`` flags fill; the client
classes that use them are in :mod:`atroposlib.inference.clients.base`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

logger = logging.getLogger(__name__)

#: Keys that upstream example YAMLs put in server configs but that have no meaning here.
_TOLERATED_LEGACY_KEYS = ("weight",)

class ServerBaseline(BaseModel):
    """Settings shared by every inference server.

    A bare ``ServerBaseline`` (no URL) returned by ``config_init`` means "servers are found by the
    launcher": ``ServerManager`` derives URLs from SLURM variables or uses localhost:9004-9007.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    timeout: int = Field(
        default=1200,
        description="Per-request timeout in seconds; also the longest wait for the server to "
        "become healthy before a request fails.",
    )
    num_max_requests_at_once: int = Field(
        default=512, description="Concurrent training requests allowed to this server."
    )
    num_requests_for_eval: int = Field(
        default=64, description="Concurrent evaluation requests allowed to this server."
    )
    model_name: str = Field(
        default="default", description="Model name sent in every request (`model`)."
    )
    rolling_buffer_length: int = Field(
        default=1000, description="How many recent request timings are kept for metrics."
    )
    server_type: Literal["openai", "trl", "sglang", "vllm"] = Field(
        default="openai",
        description="Backend class: openai (any OpenAI-compatible API), vllm (stock vLLM, "
        "token ids + logprobs), sglang, trl (trl vllm-serve).",
    )
    tokenizer_name: str = Field(
        default="none", description='Tokenizer for token-level backends; "none" = model_name.'
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_legacy_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in _TOLERATED_LEGACY_KEYS:
                if key in data:
                    logger.warning(
                        "Ignoring server config key %r (accepted for Atropos 0.4 YAML "
                        "compatibility; set env.inference_weight instead)",
                        key,
                    )
                    data = {k: v for k, v in data.items() if k != key}
        return data


class APIServerConfig(ServerBaseline):
    """One concrete inference endpoint."""

    api_key: str | None = Field(default="", description="API key / bearer token for the server.")
    base_url: str | None = Field(
        default="",
        description='OpenAI-compatible base URL, e.g. "http://127.0.0.1:9001/v1". Empty or null '
        "means the OpenAI default (https://api.openai.com/v1).",
    )
    n_kwarg_is_ignored: bool = Field(
        default=False,
        description="The server ignores `n`; fan out n parallel requests instead (auto-detected).",
    )
    health_check: bool = Field(
        default=True,
        description="Check health in the background (GET /health or /models; never a paid "
        "completion) and route requests only to healthy servers.",
    )


#: Atropos 0.4 name of :class:`APIServerConfig`.
OpenaiConfig = APIServerConfig

_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
#: The accepted ``ReasoningConfig.effort`` values (Atropos 0.4 name).
VALID_REASONING_EFFORTS = frozenset(_EFFORTS)
_EFFORT_TOKENS = {
    "none": 1024,
    "minimal": 3200,
    "low": 6400,
    "medium": 16000,
    "high": 25600,
    "xhigh": 30400,
}


@dataclass
class ReasoningConfig:
    """Reasoning ("thinking") request options injected into chat completions.

    Attributes:
        enabled: send reasoning options at all.
        effort: one of none/minimal/low/medium/high/xhigh, or None.
        max_tokens: reasoning token budget, or None.

    Raises:
        ValueError: an unknown ``effort``.
    """

    enabled: bool = False
    effort: str | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.effort is not None and self.effort not in _EFFORTS:
            raise ValueError(
                f"Invalid reasoning_effort: {self.effort!r}; use one of {', '.join(_EFFORTS)}"
            )
        if self.effort is not None or self.max_tokens is not None:
            self.enabled = True

    @classmethod
    def from_env_config(cls, env_config: Any) -> ReasoningConfig:
        """The reasoning options an env config asks for.

        Reads ``thinking_mode``, ``reasoning_effort`` and ``max_reasoning_tokens`` (absent
        fields count as unset); reasoning is enabled when any of them is set.

        Raises:
            ValueError: an unknown ``reasoning_effort``.
        """
        effort = getattr(env_config, "reasoning_effort", None)
        max_tokens = getattr(env_config, "max_reasoning_tokens", None)
        enabled = bool(getattr(env_config, "thinking_mode", False))
        return cls(enabled=enabled or effort is not None or max_tokens is not None,
                   effort=effort, max_tokens=max_tokens)

    def is_reasoning_kwargs_active(self) -> bool:
        """Whether requests carry reasoning options.

        True when ``enabled`` (also implied by an ``effort`` or ``max_tokens``).
        """
        return self.enabled

    def build_extra_body(
        self, base_url: str | None = None, use_max_tokens: bool = False
    ) -> dict[str, Any] | None:
        """Return the ``extra_body`` to send, or None when reasoning is disabled.

        Args:
            base_url: the server's base URL; api.openai.com gets ``reasoning_effort``.
            use_max_tokens: send a token budget derived from the effort instead of the effort.
        """
        if not self.enabled:
            return None
        if base_url and "api.openai.com" in base_url:
            return {"reasoning_effort": self.effort or "medium"}
        reasoning: dict[str, Any] = {"enabled": True}
        if self.effort is not None:
            if use_max_tokens:
                reasoning["max_tokens"] = _EFFORT_TOKENS.get(self.effort, 8192)
            else:
                reasoning["effort"] = self.effort
        elif self.max_tokens is not None:
            reasoning["max_tokens"] = self.max_tokens
        return {"reasoning": reasoning}


__all__ = [
    "APIServerConfig",
    "OpenaiConfig",
    "ReasoningConfig",
    "ServerBaseline",
    "VALID_REASONING_EFFORTS",
]
