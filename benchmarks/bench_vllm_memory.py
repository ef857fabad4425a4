"""vLLM on CPU: resident memory per process and sampling cost, for each way of sizing it.

Each variant starts the bundled SmolLM2-135M-Instruct with :class:`VLLMProcess` (bf16, 32-token
KV blocks, 512-token context: the quickstart's), sends the quickstart's sampling load (arithmetic
prompts of difficulty 2, ``n=8``, 24 tokens, temperature 1, ``--concurrency`` requests at once)
for ``--requests`` requests, then reloads the weights once, and reports per process (API server,
engine core, worker): peak RSS while serving, plus the CPU seconds the whole tree spent per
generated token (a cost that does not depend on how busy the machine is) and tokens/s of wall
time (which does). Variants run one after another, in the order given, alternating when repeated::

    python benchmarks/bench_vllm_memory.py --variants default,sized,sized-inproc --repeats 2

* ``default``: vLLM as before sizing: ``VLLM_CPU_KVCACHE_SPACE=2`` (2 GiB), 3 processes.
* ``sized``: the KV cache of :func:`~atroposlib.inference.sizing.size_for_training` for the
  quickstart (batch 16, max_token_len 256) and ``--max-num-seqs`` 64; 3 processes.
* ``sized-inproc``: ``sized`` with the worker inside the engine core (2 processes): how
  :class:`VLLMProcess` runs vLLM by default (oneDNN's primitive cache at its own 1024).
* ``sized-inproc-onednn64``: ``sized-inproc`` with oneDNN's primitive cache capped at 64: the
  engine's heap grows less with each new batch shape (run a few hundred requests,
  ``--requests 600``, about 4 minutes here, to see it). Not the default: the quickstart learned
  less with the cap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VARIANTS = ("default", "sized", "sized-inproc", "sized-inproc-onednn64")


def _part(proc: Any) -> str:
    try:
        cmd = " ".join(proc.cmdline()) or proc.name()
    except Exception:  # noqa: BLE001 - a process gone meanwhile
        return "other"
    for part, needle in (("worker", "VLLM::Worker"), ("engine", "VLLM::EngineCore"),
                         ("api", "vllm.entrypoints")):
        if needle in cmd:
            return part
    return "other"


class Sampler(threading.Thread):
    """Samples the RSS of a process tree every 0.25 s; keeps each part's peak."""

    def __init__(self, pid: int):
        import psutil

        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.peaks: dict[str, int] = {}
        self.total_peak = 0
        self.done = threading.Event()
        self.procs: dict[int, Any] = {pid: self.root}

    def run(self) -> None:
        while not self.done.is_set():
            self.sample()
            self.done.wait(0.25)

    def sample(self) -> None:
        import psutil

        try:
            for child in self.root.children(recursive=True):
                self.procs.setdefault(child.pid, child)
        except psutil.Error:
            pass
        now: dict[str, int] = {}
        for pid, proc in list(self.procs.items()):
            try:
                now[_part(proc)] = now.get(_part(proc), 0) + proc.memory_info().rss
            except psutil.Error:
                self.procs.pop(pid)
        self.total_peak = max(self.total_peak, sum(now.values()))
        for part, rss in now.items():
            self.peaks[part] = max(self.peaks.get(part, 0), rss)

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of every process of the tree seen so far and alive."""
        import psutil

        total = 0.0
        for proc in self.procs.values():
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
        return total


async def _load(base_url: str, model: str, requests: int, concurrency: int) -> int:
    """Send the sampling load; return the completion tokens generated."""
    import openai

    from atroposlib.environments.arithmetic_server import ArithmeticEnv, make_problem

    client = openai.AsyncOpenAI(base_url=base_url, api_key="x")
    rng = random.Random(0)
    problems = [make_problem(rng, 2, False, 0.25) for _ in range(requests)]
    sem = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(problem: dict[str, Any]) -> None:
        nonlocal tokens
        async with sem:
            reply = await client.chat.completions.create(
                model=model, messages=ArithmeticEnv.messages(problem), n=8, max_tokens=24,
                temperature=1.0, logprobs=True)
            tokens += reply.usage.completion_tokens

    await asyncio.gather(*(one(p) for p in problems))
    await client.close()
    return tokens


def run_variant(name: str, requests: int, concurrency: int, log_dir: Path,
                env: dict[str, str] | None = None, extra_args: list[str] | None = None) -> dict[str, Any]:
    """Start vLLM as ``name`` sizes it, load it, reload weights once; return the measurements."""
    from atroposlib.inference.bundled import prepare_bundled_model
    from atroposlib.inference.sizing import size_for_training
    from atroposlib.inference.vllm_process import DEFAULT_CPU_BLOCK_SIZE, VLLMProcess

    model = prepare_bundled_model()
    kwargs: dict[str, Any] = {"worker_in_engine": name.startswith("sized-inproc")}
    kwargs["env"] = dict(env or {})
    if name == "sized-inproc-onednn64":
        kwargs["env"].setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")
    if name == "default":
        kwargs["env"]["VLLM_CPU_KVCACHE_SPACE"] = "2"
    else:
        sizing = size_for_training(model, "bfloat16", batch_size=16, max_token_len=256,
                                   max_model_len=512, block_size=DEFAULT_CPU_BLOCK_SIZE)
        kwargs.update(kv_cache_bytes=sizing.kv_cache_bytes, max_num_seqs=sizing.max_num_seqs)
    vllm = VLLMProcess(model, dtype="bfloat16", max_model_len=512, extra_args=extra_args or [],
                       log_path=log_dir / f"vllm-{name}.log", **kwargs)
    begin = time.perf_counter()
    vllm.start(timeout=600)
    start_s = time.perf_counter() - begin
    sampler = Sampler(vllm.proc.pid)
    sampler.sample()
    sampler.start()
    try:
        cpu0, wall0 = sampler.cpu_seconds(), time.perf_counter()
        tokens = asyncio.run(_load(vllm.base_url, vllm.served_model_name, requests, concurrency))
        wall, cpu = time.perf_counter() - wall0, sampler.cpu_seconds() - cpu0
        reload_s = vllm.reload_weights(model)
        sampler.sample()
    finally:
        sampler.done.set()
        vllm.stop()
    gib = 2**30
    return {"variant": name, "start_seconds": round(start_s, 1), "tokens": tokens,
            "tokens_per_second": round(tokens / wall, 1),
            "cpu_ms_per_token": round(1000 * cpu / tokens, 2), "reload_seconds": round(reload_s, 2),
            "peak_rss_gib": round(sampler.total_peak / gib, 3),
            "peak_rss_gib_by_process": {k: round(v / gib, 3) for k, v in sorted(sampler.peaks.items())},
            "kv_cache_bytes": kwargs.get("kv_cache_bytes"), "max_num_seqs": kwargs.get("max_num_seqs"),
            "env": kwargs["env"], "extra_args": extra_args or []}


def main(argv: list[str] | None = None) -> int:
    """Run the variants; print one JSON line each and write them all to ``--json-out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, from {', '.join(VARIANTS)}")
    parser.add_argument("--repeats", type=int, default=1, help="passes (every other reversed)")
    parser.add_argument("--requests", type=int, default=48, help="chat requests (n=8) per variant")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="an environment variable for every variant's server (repeatable)")
    parser.add_argument("--extra-arg", action="append", default=[], metavar="FLAG[=VALUE]",
                        help="a `vllm serve` flag for every variant (repeatable)")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="result file (default: benchmarks/results/bench_vllm_memory_<date>.json)")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or any(v not in VARIANTS for v in variants):
        parser.error(f"--variants: choose from {', '.join(VARIANTS)}")
    from benchmarks.results import command_argv, default_result_path, write_result

    args.json_out = args.json_out or default_result_path("bench_vllm_memory")
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    for i in range(args.repeats):
        for name in (variants[::-1] if i % 2 else variants):
            result = run_variant(name, args.requests, args.concurrency, args.json_out.parent,
                                 dict(a.split("=", 1) for a in args.env), args.extra_arg)
            print(json.dumps(result), flush=True)
            results.append(result)
    write_result(args.json_out, "bench_vllm_memory", {"variants": results},
                 seeds={"requests": "fixed prompts; vLLM's sampling unseeded"}, argv=command_argv(__file__, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
