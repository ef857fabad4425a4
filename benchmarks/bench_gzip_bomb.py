"""Gzip bombs against a live run-api: server memory peak and the stall seen by other clients.

Workload: N clients (default 3) each POST ``/scored_data`` with a gzip body that inflates to
``--size-mib`` MiB of zeros (about 1 MiB on the wire per GiB), all at once, while a probe client
polls ``GET /status`` every 20 ms. Reported: each bomb's status code and time, the server's RSS
peak above its idle RSS (psutil, sampled every 5 ms), and the probe's worst and median latency
during the bombs next to its median before them (the stall a real env or trainer would see).

Usage::

    python benchmarks/bench_gzip_bomb.py                          # this checkout
    python benchmarks/bench_gzip_bomb.py --repo /path/to/other/checkout    # e.g. before a fix
    python benchmarks/bench_gzip_bomb.py --server-arg=--max-decompressed-bytes=1073741824

``--repo`` runs the server from another checkout (its directory is put first on PYTHONPATH), so
the same script measures before and after a change.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]


def make_bomb(size_mib: int) -> bytes:
    """Gzip stream of ``size_mib`` MiB of zeros, built 1 MiB at a time (never held inflated)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(2**20)
    parts = [packer.compress(zeros) for _ in range(size_mib)]
    parts.append(packer.flush())
    return b"".join(parts)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(repo: Path, extra: list[str]) -> tuple[subprocess.Popen, str]:
    """Start ``run-api`` from ``repo`` on a free port; return the process and its base URL."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.Popen([sys.executable, "-m", "atroposlib.cli.run_api", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning", *extra],
                            cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/status", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("run-api did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT, help="checkout to run the server from")
    parser.add_argument("--size-mib", type=int, default=1100, help="inflated size of each bomb")
    parser.add_argument("--bombs", type=int, default=3, help="bombs sent at once")
    parser.add_argument("--server-arg", action="append", default=[], help="extra run-api flag")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="result file (default: benchmarks/results/bench_gzip_bomb_<date>.json)")
    args = parser.parse_args()

    bomb = make_bomb(args.size_mib)
    proc, url = start_server(args.repo.resolve(), args.server_arg)
    server = psutil.Process(proc.pid)
    try:
        with httpx.Client(base_url=url, timeout=120) as probe_client:
            idle = []
            for _ in range(50):
                start = time.perf_counter()
                probe_client.get("/status")
                idle.append(time.perf_counter() - start)
                time.sleep(0.02)
        idle_rss = server.memory_info().rss
        peak = [idle_rss]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], server.memory_info().rss)
                time.sleep(0.005)

        during: list[float] = []

        def probe() -> None:
            with httpx.Client(base_url=url, timeout=120) as client:
                while not done.is_set():
                    start = time.perf_counter()
                    client.get("/status")
                    during.append(time.perf_counter() - start)
                    time.sleep(0.02)

        results: list[tuple[int, float]] = []

        def send() -> None:
            start = time.perf_counter()
            response = httpx.post(url + "/scored_data", content=bomb, timeout=300,
                                  headers={"Content-Type": "application/json",
                                           "Content-Encoding": "gzip"})
            results.append((response.status_code, time.perf_counter() - start))

        helpers = [threading.Thread(target=sample), threading.Thread(target=probe)]
        senders = [threading.Thread(target=send) for _ in range(args.bombs)]
        for t in helpers + senders:
            t.start()
        for t in senders:
            t.join()
        done.set()
        for t in helpers:
            t.join()
    finally:
        proc.terminate()
        proc.wait(30)
    ms = 1e3
    print(f"server: {args.repo}  extra flags: {args.server_arg or 'none'}")
    print(f"bombs: {args.bombs} x {len(bomb) / 2**20:.2f} MiB gzip -> {args.size_mib} MiB each")
    print("bomb answers: " + ", ".join(f"{code} in {s:.2f} s" for code, s in results))
    print(f"server RSS: idle {idle_rss / 2**20:.0f} MiB, peak {peak[0] / 2**20:.0f} MiB "
          f"(+{(peak[0] - idle_rss) / 2**20:.0f} MiB)")
    print(f"probe GET /status before bombs: median {statistics.median(idle) * ms:.1f} ms")
    if during:
        print(f"probe during bombs ({len(during)} requests): median "
              f"{statistics.median(during) * ms:.1f} ms, worst {max(during) * ms:.0f} ms "
              f"(worst / idle median = {max(during) / statistics.median(idle):.0f}x)")
    if str(ROOT) not in sys.path:  # benchmarks.results, when run as a script
        sys.path.insert(0, str(ROOT))
    from benchmarks.results import default_result_path, write_result

    write_result(args.json_out or default_result_path("bench_gzip_bomb"), "bench_gzip_bomb", {
        "settings": {"repo": str(args.repo), "size_mib": args.size_mib, "bombs": args.bombs,
                     "server_args": args.server_arg, "bomb_gzip_bytes": len(bomb)},
        "answers": [{"status": code, "seconds": s} for code, s in results],
        "server_rss_bytes": {"idle": idle_rss, "peak": peak[0]},
        "probe_seconds": {"idle": idle, "during": during}}, seeds=None)


if __name__ == "__main__":
    main()
