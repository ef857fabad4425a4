"""SequenceNode: one tracked sequence (prompt + completion) of a managed server, aligned position by position."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from atroposlib.api.models import MASKED_LOGPROB


@dataclass
class SequenceNode:
    """One tracked sequence (prompt + completion), aligned position by position.

    Attributes:
        full_text: the prompt text followed by the decoded completion (special tokens kept).
        tokens: ``[T]`` token ids.
        masked_tokens: ``[T]`` labels (a group's ``masks`` row): the token id where trained
            (generated), ``-100`` (the ignore index) where not (prompt).
        logprobs: ``[T]`` ``1.0`` where masked, else the sampler's log-prob of the token.
        metadata: at least ``{"finish_reason": str}``.
    """

    full_text: str
    tokens: list[int]
    masked_tokens: list[int]
    logprobs: list[float]
    metadata: dict[str, Any] = field(default_factory=dict)

    def model_dump(self) -> dict[str, Any]:
        """Return the node as a plain dict (pydantic-style name kept for compatibility)."""
        return {
            "full_text": self.full_text,
            "tokens": list(self.tokens),
            "masked_tokens": list(self.masked_tokens),
            "logprobs": list(self.logprobs),
            "metadata": dict(self.metadata),
        }


def _fit(values: list[float], length: int) -> list[float]:
    """Pad with 1.0 or truncate a per-token list to ``length`` entries."""
    values = [float(v) for v in values[:length]]
    return values + [MASKED_LOGPROB] * (length - len(values))


__all__ = ["SequenceNode"]
