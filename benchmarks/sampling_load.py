"""A fixed sampling load against an OpenAI-compatible server, timed in generated tokens per second.

The same ``requests`` prompts every time (``prompts``), each sampled at temperature 1 for exactly
``max_tokens`` tokens (``ignore_eos``), all in flight at once; the load is run ``repeats`` times
after one warm-up request, so a server's throughput under the load compares across servers and
model names (a base model, its merged weights, a LoRA adapter) on the same machine.
"""

from __future__ import annotations

import asyncio
import statistics
import time


def prompts(n: int) -> list[str]:
    """``n`` fixed arithmetic prompts (the same list on every call)."""
    return [f"Question: what is {i % 20 + 1} + {(7 * i) % 20 + 1}? Answer:" for i in range(n)]


async def _load(root: str, model: str, texts: list[str], max_tokens: int, seed: int) -> tuple[int, float]:
    import httpx

    async with httpx.AsyncClient(base_url=root, timeout=600.0, trust_env=False) as client:
        async def one(i: int, text: str) -> int:
            response = await client.post("/completions", json={
                "model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 1.0,
                "seed": seed + i, "ignore_eos": True})
            response.raise_for_status()
            return int(response.json()["usage"]["completion_tokens"])

        begin = time.perf_counter()
        counts = await asyncio.gather(*(one(i, t) for i, t in enumerate(texts)))
        return sum(counts), time.perf_counter() - begin


def sampling_load(root: str, model: str, requests: int = 32, max_tokens: int = 48,
                  repeats: int = 3) -> dict[str, float | list[float] | str | int]:
    """Tokens per second of ``requests`` concurrent completions of ``max_tokens`` tokens each.

    Args:
        root: the server's base URL, ``http://HOST:PORT/v1``.
        model: the model name to request (a served model or a loaded LoRA adapter).
        requests: completions in flight at once (keep it within the server's ``--max-num-seqs``).
        max_tokens: tokens generated per completion (``ignore_eos``: always all of them).
        repeats: timed runs of the whole load (after one untimed warm-up request).

    Returns:
        ``model``, ``requests``, ``max_tokens``, ``tokens_per_second`` (median over the
        repeats, generated tokens / wall seconds) and ``runs`` (each repeat's tokens/s).

    Raises:
        httpx.HTTPStatusError: the server refused a request (e.g. an unknown model name).
    """
    texts = prompts(requests)
    asyncio.run(_load(root, model, texts[:1], 4, 0))  # warm-up: compile paths, load the adapter
    runs = []
    for _ in range(repeats):
        tokens, seconds = asyncio.run(_load(root, model, texts, max_tokens, 0))
        runs.append(tokens / seconds)
    return {"model": model, "requests": requests, "max_tokens": max_tokens,
            "tokens_per_second": statistics.median(runs), "runs": runs}


__all__ = ["prompts", "sampling_load"]
