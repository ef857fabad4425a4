"""Measure generation throughput (tokens/s) of an OpenAI-compatible vLLM server.

Rollout speed is what bounds an RL loop on small hardware, and it depends on how many
sequences decode together. This measures, against the same server in the same run:

* ``single``: one request, ``n=1`` (the baseline);
* ``n``: one request with ``n`` choices (a GRPO group, e.g. ``n=8``);
* ``concurrent``: ``concurrency`` parallel ``n=1`` requests;

each generating exactly ``max_tokens`` tokens (``ignore_eos``) at temperature 1, and reports
tokens/s plus the speed-up ratios over the single stream::

    python -m atroposlib.inference.throughput --base-url http://127.0.0.1:9100/v1 --model smollm2
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from atroposlib.defaults import DEFAULT_INFERENCE_MODEL, DEFAULT_INFERENCE_URL
from atroposlib.utils.flags import ArgumentParser

PROMPT = "Write a short story about a robot who learns to paint."


async def _timed(client: Any, model: str, n: int, max_tokens: int, streams: int) -> float:
    """Run ``streams`` parallel requests of ``n`` choices; return generated tokens per second."""
    begin = time.perf_counter()
    results = await asyncio.gather(
        *(
            client.completions.create(
                model=model,
                prompt=PROMPT,
                n=n,
                max_tokens=max_tokens,
                temperature=1.0,
                extra_body={"ignore_eos": True},
            )
            for _ in range(streams)
        )
    )
    seconds = time.perf_counter() - begin
    tokens = sum(r.usage.completion_tokens for r in results)
    return tokens / seconds


async def measure(
    base_url: str,
    model: str,
    n: int = 8,
    concurrency: int = 32,
    max_tokens: int = 128,
    repeats: int = 3,
) -> dict[str, float]:
    """Measure throughput; each figure is the median of ``repeats`` runs after one warm-up.

    Args:
        base_url: OpenAI base URL of a vLLM server, e.g. ``http://127.0.0.1:9100/v1``.
        model: served model name.
        n: choices per request for the group measurement.
        concurrency: parallel single-choice requests for the batch measurement (0 skips it).
        max_tokens: tokens generated per sequence (exactly: EOS is ignored).
        repeats: runs per figure.

    Returns:
        ``{"single_tok_s", "n_tok_s", "concurrent_tok_s", "n_speedup", "concurrent_speedup"}``
        (tokens/s of generated tokens; speed-ups are ratios over ``single_tok_s``).

    Raises:
        openai.APIError: the server refused a request.
    """
    import openai

    async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as client:
        await _timed(client, model, 1, 8, 1)  # warm-up
        runs: dict[str, list[float]] = {"single": [], "n": [], "concurrent": []}
        for _ in range(repeats):
            runs["single"].append(await _timed(client, model, 1, max_tokens, 1))
            runs["n"].append(await _timed(client, model, n, max_tokens, 1))
            if concurrency > 0:
                runs["concurrent"].append(await _timed(client, model, 1, max_tokens, concurrency))
    single = statistics.median(runs["single"])
    result = {"single_tok_s": single, "n_tok_s": statistics.median(runs["n"])}
    result["n_speedup"] = result["n_tok_s"] / single
    if runs["concurrent"]:
        result["concurrent_tok_s"] = statistics.median(runs["concurrent"])
        result["concurrent_speedup"] = result["concurrent_tok_s"] / single
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: print the throughput figures as one JSON object.

    Returns:
        The exit code.
    """
    parser = ArgumentParser(
        prog="python -m atroposlib.inference.throughput", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--base-url", default=DEFAULT_INFERENCE_URL,
                        help=f"OpenAI-compatible base URL (default {DEFAULT_INFERENCE_URL})")
    parser.add_argument("--model", default=DEFAULT_INFERENCE_MODEL,
                        help=f"served model name (default {DEFAULT_INFERENCE_MODEL})")
    parser.add_argument("--n", type=int, default=8, help="choices per request (group size)")
    parser.add_argument("--concurrency", type=int, default=32, help="0 skips the batch figure")
    parser.add_argument("--max-tokens", type=int, default=128,
                        help="tokens generated per choice, EOS ignored (default 128)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs per figure, after one warm-up; the median is reported (default 3)")
    args = parser.parse_args(argv)
    result = asyncio.run(
        measure(args.base_url, args.model, args.n, args.concurrency, args.max_tokens, args.repeats)
    )
    print(json.dumps({k: round(v, 2) for k, v in result.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
