"""Diverse group sampling: start each completion with a different likely first token.

Atropos 0.4 shipped :func:`generate_with_diverse_first_tokens` as a method-like function that
takes the env as ``self``. Sampling N completions at temperature T often yields N near-copies
that begin alike; forcing distinct first tokens (drawn from the model's top-20 first-token
distribution) spreads the group out.
"""

from __future__ import annotations

import math
import random
from typing import Any


def sample_distinct(
    candidates: list[tuple[str, float]], n: int, temperature: float = 1.0,
    rng: random.Random | None = None,
) -> list[str]:
    """Draw up to ``n`` distinct tokens from ``(token, logprob)`` pairs without replacement.

    Each draw picks among the remaining tokens with probability ∝ ``exp(logprob / T)``.

    Returns:
        ``min(n, len(candidates))`` distinct tokens, in draw order.

    Raises:
        ValueError: ``temperature`` <= 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    rng = rng or random
    pool = list(candidates)
    top = max((lp for _, lp in pool), default=0.0)
    chosen: list[str] = []
    while pool and len(chosen) < n:
        weights = [math.exp((lp - top) / temperature) for _, lp in pool]
        index = rng.choices(range(len(pool)), weights=weights)[0]
        chosen.append(pool.pop(index)[0])
    return chosen


async def generate_with_diverse_first_tokens(
    self: Any,
    messages: list[dict[str, Any]],
    prefill: str = "",
    n: int = 8,
    max_tokens: int = 4096,
    temperature: float = 1.0,
) -> list[str]:
    """Generate up to ``n`` completions whose first tokens all differ.

    One greedy 1-token request reads the top-20 first-token logprobs; :func:`sample_distinct`
    picks ``n`` of them; each is then continued in its own request (``max_tokens - 1`` tokens,
    ``top_p=0.3``, ``min_p=0.5``, ``repetition_penalty=1.05``, as Atropos 0.4 did).

    Args:
        self: the env (anything with ``.server.chat_completion``); ``self.fallback_generate``
            (same arguments) is used when the server returns no logprobs.
        messages: the chat so far.
        prefill: text the assistant turn starts with (not repeated in the results).
        n: completions wanted; fewer come back when the server offers fewer candidates.
        max_tokens: tokens per completion, the forced first token included.
        temperature: sampling temperature for the first token and the continuations.

    Returns:
        Completion texts, each the forced first token plus its continuation. (Atropos 0.4's
        version built this list and then returned None.)

    Raises:
        AttributeError: the server gave no logprobs and ``self`` has no ``fallback_generate``.
    """
    first = await self.server.chat_completion(
        messages=messages + [{"role": "assistant", "content": prefill}],
        n=1, max_tokens=1, temperature=0.0, logprobs=True, top_logprobs=20,
    )
    try:
        top = first.choices[0].logprobs.content[0].top_logprobs
        candidates = [(item.token, item.logprob) for item in top]
    except (AttributeError, IndexError, KeyError, TypeError):
        return await self.fallback_generate(messages, prefill, n, max_tokens, temperature)
    completions = []
    for token in sample_distinct(candidates, n, temperature):
        rest = await self.server.chat_completion(
            messages=messages + [{"role": "assistant", "content": prefill + token}],
            n=1, max_tokens=max_tokens - 1, temperature=temperature, top_p=0.3,
            extra_body={"min_p": 0.5, "repetition_penalty": 1.05},
        )
        completions.append(token + (rest.choices[0].message.content or ""))
    return completions
