"""Keep multi-turn message histories short: trim ``<think>`` blocks and over-long steps.

Environments that feed a model's earlier answers back into its next prompt (multi-step
agents, games) use these so the history stays inside the context window.
"""

from __future__ import annotations

import logging
from typing import Any

from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

logger = logging.getLogger(__name__)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def _think_span(text: str) -> tuple[int, int] | None:
    """Locate the reasoning of the first complete ``<think>...</think>`` block.

    Returns ``(start, end)`` exclusive of the tags, or None when there is no complete block.
    """
    start = text.find(THINK_OPEN)
    if start < 0:
        return None
    start += len(THINK_OPEN)
    end = text.find(THINK_CLOSE, start)
    return None if end < 0 else (start, end)


def strip_thinking(response_text: str) -> str:
    """Remove the ``<think>...</think>`` block (tags included) from a response.

    A response without a complete block is returned unchanged.
    """
    span = _think_span(response_text)
    if span is None:
        return response_text
    head = response_text[: span[0] - len(THINK_OPEN)]
    tail = response_text[span[1] + len(THINK_CLOSE):]
    return (head + tail.lstrip()) if not head.strip() else head + tail


def truncate_thinking(response_text: str, tokenizer: Any, max_think_tokens: int) -> str:
    """Shorten the ``<think>`` block of a response to at most ``max_think_tokens`` tokens.

    The END of the reasoning is kept (it usually holds the conclusion the answer rests on),
    preceded by ``"..."``; the tags and everything outside them are kept as they are. A
    response without a complete ``<think>...</think>`` block, or whose reasoning is already
    short enough, is returned unchanged.

    Args:
        response_text: the assistant's response.
        tokenizer: an HF tokenizer (``encode``/``decode``) used to count tokens.
        max_think_tokens: reasoning budget in tokens; ``<= 0`` empties the block.

    Returns:
        The response with its reasoning trimmed.
    """
    span = _think_span(response_text)
    if span is None:
        return response_text
    thinking = response_text[span[0]: span[1]]
    ids = tokenizer.encode(thinking, add_special_tokens=False)
    if len(ids) <= max_think_tokens:
        return response_text
    kept = tokenizer.decode(ids[-max_think_tokens:]) if max_think_tokens > 0 else ""
    trimmed = f"...{kept.lstrip()}" if kept else ""
    return response_text[: span[0]] + trimmed + response_text[span[1]:]


def _removable_ranges(messages: list[dict[str, Any]]) -> int:
    """How many messages after a leading system prompt may go (the last two always stay)."""
    first = 1 if messages and messages[0].get("role") == "system" else 0
    return max(0, len(messages) - 2 - first)


def ensure_trajectory_token_limit(
    trajectory: list[dict[str, Any]], tokenizer: Any, max_trajectory_tokens: int
) -> list[dict[str, Any]]:
    """Fit every step of a multi-turn episode into ``max_trajectory_tokens`` tokens.

    Each step is a scored group with ``messages`` (``[G]`` chats), ``tokens`` and ``masks``
    (``[G][T]``). When a step's longest sequence is over the limit, the OLDEST messages after
    the system prompt are dropped from all ``G`` alternatives alike (a whole user/assistant
    pair at a time where possible), and ``tokens``/``masks`` are re-tokenized with
    :func:`~atroposlib.utils.tokenize_for_trainer.tokenize_for_trainer` (training on the last
    message). The system prompt and the last two messages (the final observation and the
    response being trained on) are never dropped; a step still over the limit then is left
    out of the result (and logged). Steps within the limit, or lacking ``messages``, are
    returned untouched (the same objects).

    Args:
        trajectory: the episode's steps, in order.
        tokenizer: the HF tokenizer the tokens were made with.
        max_trajectory_tokens: the largest allowed sequence length, in tokens.

    Returns:
        A new list of steps, each within the limit.
    """
    kept: list[dict[str, Any]] = []
    for index, step in enumerate(trajectory):
        tokens = step.get("tokens") or []
        if not tokens or max(len(t) for t in tokens) <= max_trajectory_tokens:
            kept.append(step)
            continue
        chats = step.get("messages")
        if not chats or len(chats) != len(tokens):
            logger.warning("step %d is over %d tokens and has no messages to trim; dropped",
                           index, max_trajectory_tokens)
            continue
        chats = [list(chat) for chat in chats]
        fitted = None
        while all(_removable_ranges(chat) > 0 for chat in chats):
            for chat in chats:
                first = 1 if chat[0].get("role") == "system" else 0
                drop = 2 if _removable_ranges(chat) >= 2 else 1
                del chat[first: first + drop]
            rendered = [tokenize_for_trainer(tokenizer, chat) for chat in chats]
            if max(len(r["tokens"]) for r in rendered) <= max_trajectory_tokens:
                fitted = rendered
                break
        if fitted is None:
            logger.warning("step %d cannot fit in %d tokens even with its history trimmed; "
                           "dropped", index, max_trajectory_tokens)
            continue
        new_step = dict(step)
        new_step["messages"] = chats
        new_step["tokens"] = [r["tokens"] for r in fitted]
        new_step["masks"] = [r["masks"] for r in fitted]
        kept.append(new_step)
    return kept


__all__ = ["ensure_trajectory_token_limit", "strip_thinking", "truncate_thinking"]
