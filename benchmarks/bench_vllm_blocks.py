"""vLLM CPU KV-cache block size vs GRPO group sampling speed, each size measured in the same run.

vLLM's prefix cache shares whole KV blocks only. On CPU its default block is 128 tokens, so
the ``n`` rollouts of a group whose prompt is shorter than that each prefill the prompt again.
This starts one real vLLM (bundled SmolLM2-135M, bf16) per block size and measures, per size:

* ``short``: chat prompts of arithmetic problems (~48 tokens), ``n=8``, 24 new tokens: the
  quickstart's rollout shape;
* ``long``: the same prompts, ``n=8``, 128 new tokens (decode-heavy: checks that small blocks
  do not slow long generations down);

each as groups/s over ``--groups`` groups with ``--concurrency`` groups in flight, after a
warm-up, repeated ``--repeats`` times with the sizes interleaved. It prints the prefix-cache hit
rate (from ``/metrics``) and every size's speed as a ratio to the first size. Usage::

    python benchmarks/bench_vllm_blocks.py --block-sizes 128,32
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

from atroposlib.inference.bundled import prepare_bundled_model
from atroposlib.inference.vllm_process import VLLMProcess
from atroposlib.utils.flags import ArgumentParser

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks.results, when run as a script
    sys.path.insert(0, str(ROOT))

SHAPES = {"short": 24, "long": 128}


def questions(count: int, seed: int) -> list[str]:
    """``count`` arithmetic questions like the quickstart env's (difficulty 2: operands 1..20)."""
    rng = random.Random(seed)
    return [f"What is {rng.randint(1, 20)} + {rng.randint(1, 20)}?" for _ in range(count)]


def prefix_cache_counters(base_url: str) -> tuple[float, float]:
    """(hits, queries) of vLLM's prefix cache, in tokens, from its Prometheus ``/metrics``."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    totals = {"hits": 0.0, "queries": 0.0}
    for line in text.splitlines():
        for key in totals:
            if line.startswith(f"vllm:prefix_cache_{key}"):
                totals[key] += float(line.rsplit(" ", 1)[1])
    return totals["hits"], totals["queries"]


async def groups_per_second(base_url: str, count: int, concurrency: int, max_tokens: int,
                            seed: int) -> float:
    """Sample ``count`` groups of 8 rollouts, ``concurrency`` at a time; return groups/s."""
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        async def one(question: str) -> None:
            async with limit:
                response = await client.post("/chat/completions", json={
                    "model": "smollm2", "messages": [{"role": "user", "content": question}],
                    "n": 8, "max_tokens": max_tokens, "temperature": 1.0})
                response.raise_for_status()
        begin = time.perf_counter()
        await asyncio.gather(*(one(q) for q in questions(count, seed)))
        return count / (time.perf_counter() - begin)


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-sizes", default="128,32",
                        help="Comma-separated block sizes; the first is the baseline.")
    parser.add_argument("--groups", type=int, default=24, help="Groups timed per measurement.")
    parser.add_argument("--concurrency", type=int, default=4, help="Groups in flight.")
    parser.add_argument("--repeats", type=int, default=2, help="Rounds over all sizes.")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="result file (default: benchmarks/results/bench_vllm_blocks_<date>.json)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.block_sizes.split(",")]
    model = prepare_bundled_model()
    speed: dict[tuple[int, str], list[float]] = {}
    hit_rate: dict[int, float] = {}
    for repeat in range(args.repeats):
        for size in sizes:
            with VLLMProcess(model, dtype="bfloat16", max_model_len=512,
                             extra_args=["--block-size", str(size)]) as server:
                asyncio.run(groups_per_second(server.base_url, 4, args.concurrency, 8, 999))
                hits0, queries0 = prefix_cache_counters(server.base_url)
                for shape, max_tokens in SHAPES.items():
                    rate = asyncio.run(groups_per_second(server.base_url, args.groups,
                                                         args.concurrency, max_tokens, repeat))
                    speed.setdefault((size, shape), []).append(rate)
                    print(f"round {repeat + 1} block {size:>4} {shape:>5}: {rate:.2f} groups/s",
                          flush=True)
                hits, queries = prefix_cache_counters(server.base_url)
                hit_rate[size] = (hits - hits0) / max(queries - queries0, 1.0)
    base = sizes[0]
    print(f"\nmedian groups/s over {args.repeats} round(s); ratio to block {base}:")
    for size in sizes:
        cells = []
        for shape in SHAPES:
            rate = statistics.median(speed[(size, shape)])
            ratio = rate / statistics.median(speed[(base, shape)])
            cells.append(f"{shape} {rate:.2f} ({ratio:.2f}x)")
        print(f"block {size:>4}: " + ", ".join(cells) + f", prefix-cache hits {hit_rate[size]:.0%}")
    from benchmarks.results import default_result_path, write_result

    write_result(args.json_out or default_result_path("bench_vllm_blocks"), "bench_vllm_blocks", {
        "settings": {"block_sizes": sizes, "groups": args.groups, "concurrency": args.concurrency,
                     "repeats": args.repeats, "shapes": SHAPES},
        "baseline_block_size": base,
        "groups_per_second": [{"block_size": size, "shape": shape, "rounds": rates}
                              for (size, shape), rates in speed.items()],
        "prefix_cache_hit_rate": {str(size): rate for size, rate in hit_rate.items()}},
        seeds={"warm-up questions": 999, "round r questions": "r"})


if __name__ == "__main__":
    main()
