"""SequenceNode: one tracked sequence (prompt + completion) of a managed server, aligned position by position."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from atroposlib.api.models import IGNORE_INDEX, MASKED_LOGPROB


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


def sampled_node(prompt: str, completion_text: str, prompt_tokens: list[int],
                 parent: SequenceNode | None, output_tokens: list[int],
                 output_logprobs: list[float], finish_reason: str) -> SequenceNode:
    """The node of one sampled choice: prompt positions masked, generated positions trained.

    Args:
        prompt: the prompt text sent.
        completion_text: the choice's decoded completion (special tokens kept).
        prompt_tokens: ``[P]`` the prompt's token ids as the server saw them.
        parent: the tracked node this prompt extends, or None. When ``prompt_tokens`` start
            with its tokens, its masks and log-probs are kept (earlier completions stay trained).
        output_tokens: ``[T]`` the sampled token ids.
        output_logprobs: ``[T]`` their sampler log-probs (padded with 1.0 or cut to ``T``).
        finish_reason: the choice's finish reason, kept in ``metadata``.

    Returns:
        A node of ``P + T`` positions: ``masked_tokens`` is ``-100`` at new prompt positions
        and the token id at generated ones; ``logprobs`` is ``1.0`` at new prompt positions.
    """
    n_prompt = len(prompt_tokens)
    if parent is not None and prompt_tokens[: len(parent.tokens)] == list(parent.tokens):
        masks = list(parent.masked_tokens) + [IGNORE_INDEX] * (n_prompt - len(parent.tokens))
        logprobs = list(parent.logprobs) + [MASKED_LOGPROB] * (n_prompt - len(parent.tokens))
    else:
        masks = [IGNORE_INDEX] * n_prompt
        logprobs = [MASKED_LOGPROB] * n_prompt
    masks += list(output_tokens)
    logprobs += _fit(list(output_logprobs), len(output_tokens))
    return SequenceNode(
        full_text=prompt + completion_text,
        tokens=list(prompt_tokens) + list(output_tokens),
        masked_tokens=masks,
        logprobs=logprobs,
        metadata={"finish_reason": finish_reason},
    )


__all__ = ["SequenceNode", "sampled_node"]
