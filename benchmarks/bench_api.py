"""Benchmark run-api against upstream Atropos 0.4.0's run-api, measured in the same run.

Workload (defaults): 200 groups of 8 x 1024 tokens with masks, scores and inference_logprobs,
POSTed at concurrency 8 (bodies gzipped as BaseEnv does), then GET /batch (batch_size 64) until
the queue is drained. Reported per server: groups/s, p50/p99 POST latency, /batch latency,
end-to-end time (post + drain), server RSS per queued token (psutil on the server pid: RSS after
posting minus RSS before, divided by queued tokens), and one /batch of 64 x 4096 tokens (server
time from our Server-Timing header; client-side latency for both). Ratios are upstream / ours.

Usage::

    python benchmarks/bench_api.py                       # start ours + upstream, compare
    python benchmarks/bench_api.py --with-db             # also ours with --db (SQLite)
    python benchmarks/bench_api.py --url http://127.0.0.1:8000 --no-upstream
    python benchmarks/bench_api.py --json-out /tmp/bench_api.json     # default: benchmarks/results/
    python benchmarks/bench_api.py --no-upstream --with-db --ours-arg=--db-synchronous --ours-arg=FULL

The upstream server runs from ``.bench/upstream-venv`` (created on first use with
``pip install atroposlib==0.4.0``; if that would pull torch/CUDA, it installs with ``--no-deps``
plus the few packages run-api needs).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np
import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fixtures.upstream import ensure_upstream_venv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline",
               "DO_NOT_TRACK": "1", "VLLM_NO_USAGE_STATS": "1"}


@dataclass
class Result:
    """Measurements for one server."""

    name: str
    groups: int = 0
    post_s: float = 0.0
    groups_per_s: float = 0.0
    post_p50_ms: float = 0.0
    post_p99_ms: float = 0.0
    drain_s: float = 0.0
    batches: int = 0
    batch_p50_ms: float = 0.0
    batch_p99_ms: float = 0.0
    end_to_end_s: float = 0.0
    rss_before_mb: float = 0.0
    rss_after_mb: float = 0.0
    bytes_per_queued_token: float = 0.0
    big_batch_client_ms: float = 0.0
    big_batch_server_ms: float | None = None
    big_batch_bytes: int = 0
    errors: list[str] = field(default_factory=list)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A run-api subprocess (ours or upstream) on a free port."""

    def __init__(self, name: str, argv: list[str], cwd: Path, port: int, isolated: bool = False):
        """Start ``argv`` in ``cwd``; ``isolated`` drops ``PYTHONPATH``, so upstream's venv cannot
        import our checkout through it."""
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-{name}-", suffix=".log", delete=False)
        env = {**os.environ, **OFFLINE_ENV}
        if isolated:
            env.pop("PYTHONPATH", None)
        self.proc = subprocess.Popen(argv, cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited: {Path(self.log.name).read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/info", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not start: {Path(self.log.name).read_text()[-2000:]}")

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def make_bodies(n: int, group_size: int, seq_len: int, prompt_len: int, seed: int) -> list[bytes]:
    """JSON bodies of ``n`` distinct groups, gzipped as BaseEnv does (>= 1 KiB and smaller)."""
    rng = np.random.default_rng(seed)
    bodies = []
    for _ in range(n):
        tokens = rng.integers(1, 49_152, size=(group_size, seq_len))
        masks = tokens.copy()
        masks[:, :prompt_len] = -100
        logprobs = -rng.exponential(1.0, size=(group_size, seq_len))
        logprobs[:, :prompt_len] = 1.0
        group = {"tokens": tokens.tolist(), "masks": masks.tolist(),
                 "scores": rng.random(group_size).tolist(),
                 "inference_logprobs": logprobs.tolist(),
                 "messages": None, "env_id": None,
                 "generation_params": {"temperature": 1.0}}
        raw = orjson.dumps(group)
        packed = gzip.compress(raw, compresslevel=6)
        bodies.append(packed if len(packed) < len(raw) else raw)
    return bodies


def registration(batch_size: int) -> dict:
    return {"wandb_group": "bench", "wandb_project": "bench", "batch_size": batch_size,
            "max_token_len": 8192, "checkpoint_dir": "/tmp/bench", "save_checkpoint_interval": 0,
            "starting_step": 0, "num_steps": 1000}


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


async def post_all(url: str, bodies: list[bytes], concurrency: int) -> tuple[float, list[float], list[str]]:
    latencies: list[float] = []
    errors: list[str] = []
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                headers = {"Content-Type": "application/json"}
                if body[:2] == b"\x1f\x8b":
                    headers["Content-Encoding"] = "gzip"
                start = time.perf_counter()
                response = await client.post("/scored_data", content=body, headers=headers)
                latencies.append(time.perf_counter() - start)
                if response.status_code != 200:
                    errors.append(f"POST {response.status_code}: {response.text[:200]}")

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - start, latencies, errors


def drain(url: str) -> tuple[float, list[float], int]:
    """GET /batch until null, parsing each body as a trainer would; returns (s, latencies, n)."""
    latencies = []
    with httpx.Client(base_url=url, timeout=300) as client:
        start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            response = client.get("/batch")
            batch = orjson.loads(response.content).get("batch")
            if not batch:
                break
            latencies.append(time.perf_counter() - t0)
        return time.perf_counter() - start, latencies, len(latencies)


def big_batch(server: Server, bodies: list[bytes], result: Result) -> None:
    """Time one /batch of 64 x 4096 tokens (8 groups of 8)."""
    with httpx.Client(base_url=server.url, timeout=300) as client:
        client.get("/reset_data")
        client.post("/register", json=registration(64))
        client.get("/batch")
        for body in bodies:
            headers = {"Content-Type": "application/json"}
            if body[:2] == b"\x1f\x8b":
                headers["Content-Encoding"] = "gzip"
            client.post("/scored_data", content=body, headers=headers)
        start = time.perf_counter()
        response = client.get("/batch")
        batch = orjson.loads(response.content)["batch"]
        result.big_batch_client_ms = (time.perf_counter() - start) * 1e3
        result.big_batch_bytes = len(response.content)
        assert batch and sum(len(g["tokens"]) for g in batch) == 64
        timing = response.headers.get("server-timing")
        if timing and "dur=" in timing:
            result.big_batch_server_ms = float(timing.split("dur=")[1])


def run_one(server: Server, bodies: list[bytes], big_bodies: list[bytes], args) -> Result:
    result = Result(server.name, groups=len(bodies))
    with httpx.Client(base_url=server.url, timeout=60) as client:
        client.get("/reset_data")
        client.post("/register", json=registration(args.batch_size)).raise_for_status()
        client.get("/batch")
    time.sleep(0.5)
    before = server.rss()
    result.post_s, latencies, result.errors = asyncio.run(
        post_all(server.url, bodies, args.concurrency))
    time.sleep(0.5)
    after = server.rss()
    tokens = len(bodies) * args.group_size * args.seq_len
    result.rss_before_mb = before / 2**20
    result.rss_after_mb = after / 2**20
    result.bytes_per_queued_token = (after - before) / tokens
    result.groups_per_s = len(bodies) / result.post_s
    result.post_p50_ms = pct(latencies, 50) * 1e3
    result.post_p99_ms = pct(latencies, 99) * 1e3
    result.drain_s, batch_latencies, result.batches = drain(server.url)
    result.batch_p50_ms = pct(batch_latencies, 50) * 1e3
    result.batch_p99_ms = pct(batch_latencies, 99) * 1e3
    result.end_to_end_s = result.post_s + result.drain_s
    expected = len(bodies) * args.group_size // args.batch_size
    if result.batches != expected:
        result.errors.append(f"drained {result.batches} batches, expected {expected}")
    big_batch(server, big_bodies, result)
    return result


def print_table(results: list[Result]) -> None:
    rows = [
        ("groups/s (POST)", "groups_per_s", "{:.1f}"), ("POST p50 ms", "post_p50_ms", "{:.1f}"),
        ("POST p99 ms", "post_p99_ms", "{:.1f}"), ("/batch p50 ms", "batch_p50_ms", "{:.1f}"),
        ("/batch p99 ms", "batch_p99_ms", "{:.1f}"), ("post s", "post_s", "{:.2f}"),
        ("drain s", "drain_s", "{:.2f}"), ("end-to-end s", "end_to_end_s", "{:.2f}"),
        ("RSS bytes/queued token", "bytes_per_queued_token", "{:.1f}"),
        ("64x4096 /batch client ms", "big_batch_client_ms", "{:.1f}"),
        ("64x4096 /batch server ms", "big_batch_server_ms", "{}"),
    ]
    width = 26
    print("".join([f"{'':{width}}", *(f"{r.name:>16}" for r in results)]))
    for label, key, fmt in rows:
        cells = []
        for r in results:
            value = getattr(r, key)
            cells.append(f"{(fmt.format(value) if value is not None else '-'):>16}")
        print(f"{label:{width}}" + "".join(cells))


def ratios(ours: Result, upstream: Result) -> dict[str, float]:
    return {
        "end_to_end_speedup": upstream.end_to_end_s / ours.end_to_end_s,
        "post_throughput_ratio": ours.groups_per_s / upstream.groups_per_s,
        "drain_speedup": upstream.drain_s / ours.drain_s,
        "batch_p50_speedup": upstream.batch_p50_ms / ours.batch_p50_ms,
        "memory_per_token_ratio": ours.bytes_per_queued_token / upstream.bytes_per_queued_token,
        "big_batch_speedup": upstream.big_batch_client_ms / ours.big_batch_client_ms,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="benchmark this running server instead of starting ours")
    parser.add_argument("--upstream-url", help="a running upstream run-api instead of starting one")
    parser.add_argument("--no-upstream", action="store_true", help="skip the upstream baseline")
    parser.add_argument("--with-db", action="store_true", help="also run ours with --db (SQLite)")
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--json-out", type=Path, default=None,
                        help="result file (default: benchmarks/results/bench_api_<date>.json)")
    parser.add_argument("--ours-arg", action="append", default=[],
                        help="extra run-api flag for our server (repeat), e.g. "
                        "--ours-arg=--db-synchronous --ours-arg=FULL")
    args = parser.parse_args(argv)

    print(f"[bench] building {args.groups} groups of {args.group_size} x {args.seq_len} tokens")
    bodies = make_bodies(args.groups, args.group_size, args.seq_len, args.prompt_len, seed=0)
    big = make_bodies(8, 8, 4096, 1024, seed=1)
    targets: list[tuple[str, callable]] = []
    ours_cmd = [sys.executable, "-m", "atroposlib.cli.run_api", "--host", "127.0.0.1",
                "--log-level", "warning", *args.ours_arg]
    scratch = Path(tempfile.mkdtemp(prefix="bench-api-"))
    if args.url:
        targets.append(("ours", lambda: _External("ours", args.url)))
    else:
        targets.append(("ours", lambda: _start("ours", ours_cmd, ROOT)))
        if args.with_db:
            db_cmd = [*ours_cmd, "--db", str(scratch / "bench.db")]
            targets.append(("ours+db", lambda: _start("ours+db", db_cmd, ROOT)))
    if not args.no_upstream:
        if args.upstream_url:
            targets.append(("upstream-0.4", lambda: _External("upstream-0.4", args.upstream_url)))
        else:
            python = ensure_upstream_venv()
            # run from a scratch cwd: `python -m` would otherwise import our atroposlib from ROOT
            cmd = [str(python), "-m", "atroposlib.cli.run_api", "--host", "127.0.0.1"]
            targets.append(("upstream-0.4", lambda: _start("upstream-0.4", cmd, scratch, isolated=True)))
    results = []
    for name, start in targets:
        print(f"[bench] {name}: starting")
        server = start()
        try:
            results.append(run_one(server, bodies, big, args))
        finally:
            server.stop()
        print(f"[bench] {name}: done {asdict(results[-1])['errors'] or ''}")
    print_table(results)
    out = {"config": vars(args) | {"json_out": str(args.json_out)},
           "results": [asdict(r) for r in results]}
    by_name = {r.name: r for r in results}
    if "ours" in by_name and "upstream-0.4" in by_name:
        out["ratios"] = ratios(by_name["ours"], by_name["upstream-0.4"])
        print("ratios (ours vs upstream): " + ", ".join(
            f"{k}={v:.2f}" for k, v in out["ratios"].items()))
    from benchmarks.results import command_argv, default_result_path, write_result

    write_result(args.json_out or default_result_path("bench_api"), "bench_api",
                 orjson.loads(orjson.dumps(out)), seeds={"groups": 0, "big batch": 1}, argv=command_argv(__file__, argv))
    return 1 if any(r.errors for r in results) else 0


class _External:
    """A server started by someone else (``--url``): RSS comes from the process on its port."""

    def __init__(self, name: str, url: str):
        self.name = name
        self.url = url.rstrip("/")
        port = httpx.URL(self.url).port
        self._pid = next((c.pid for c in psutil.net_connections("tcp")
                          if c.laddr and c.laddr.port == port and c.status == "LISTEN"), None)

    def rss(self) -> int:
        return psutil.Process(self._pid).memory_info().rss if self._pid else 0

    def stop(self) -> None:
        pass


def _start(name: str, cmd: list[str], cwd: Path, isolated: bool = False) -> Server:
    port = free_port()
    return Server(name, [*cmd, "--port", str(port)], cwd, port, isolated)


if __name__ == "__main__":
    sys.exit(main())
