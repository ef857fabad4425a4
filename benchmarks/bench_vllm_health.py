"""Seconds from a SIGKILL to vLLM until the trainer's health watch reports it dead.

Usage::

    python benchmarks/bench_vllm_health.py [--kills 3] [--interval 1.0] [--grace 10]
                                           [--seed 0] [--json-out RESULT.json]

Starts a real vLLM serving the bundled model (:class:`~atroposlib.inference.vllm_process.VLLMProcess`,
float32, as the test fixtures do), then runs the trainer's two health watches on it side by side,
each a :class:`~example_trainer.health.HealthWatch` around
:meth:`~example_trainer.vllm_sync.VLLMSync.health_problem`, the probe the trainer uses:

* ``launched``: the trainer started this vLLM (it polls the process: an exit is death at once);
* ``external``: the trainer was given ``--vllm-url`` (it polls ``GET /health``; death after
  ``grace`` seconds of failed checks in a row).

After a random wait of 1 to 2 poll intervals (seeded), it sends SIGKILL to vLLM's API server
process and records the seconds until each watch calls its ``on_failure``; then it stops what
is left of vLLM (its engine core) and starts it again for the next kill. Each detection time is
also given as a ratio to the watch's poll interval (the bound for ``launched`` is one interval
plus the probe; for ``external`` it is ``grace`` plus about one interval and the last probe's
time-out).

Writes ``benchmarks/results/bench_vllm_health_<date>.json`` (or ``--json-out``) through
:func:`benchmarks.results.write_result` (``meta``: the command, commit, machine, date, seed):
the settings and every raw number. About a minute a kill on a 2-core CPU box
(most of it vLLM's start-up).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import command_argv, default_result_path, write_result  # noqa: E402


class Detection:
    """The moment a watch reported the server dead (its ``on_failure``), and its message."""

    def __init__(self) -> None:
        """Nothing detected yet."""
        self.at: float | None = None
        self.message: str | None = None
        self.event = threading.Event()

    def __call__(self, error: BaseException) -> None:
        """``on_failure`` of a :class:`~example_trainer.health.HealthWatch`."""
        self.at = time.monotonic()
        self.message = str(error)
        self.event.set()


def summary(seconds: list[float], interval: float) -> dict:
    """``n``, min/median/max seconds and the median/max ratio to ``interval``."""
    if not seconds:
        return {"n": 0}
    return {"n": len(seconds), "min_s": min(seconds), "median_s": statistics.median(seconds),
            "max_s": max(seconds), "median_ratio": statistics.median(seconds) / interval,
            "max_ratio": max(seconds) / interval}


def one_kill(process, watches: dict, rng: random.Random, interval: float, wait: float) -> dict:
    """Start the watches, SIGKILL vLLM's API server, time each watch's report; return the trial."""
    from example_trainer.health import HealthWatch

    detections = {name: Detection() for name in watches}
    running = [HealthWatch(probe, detections[name], interval=interval, grace=grace).start()
               for name, (probe, grace) in watches.items()]
    delay = interval * (1 + rng.random())
    time.sleep(delay)
    alive_before = {name: d.at is None for name, d in detections.items()}
    pid = process.proc.pid
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    trial: dict = {"pid": pid, "wait_before_kill_s": delay, "alive_at_kill": alive_before}
    for name, det in detections.items():
        det.event.wait(max(0.0, killed_at + wait - time.monotonic()))
        seconds = None if det.at is None else det.at - killed_at
        trial[name] = {"detected_s": seconds,
                       "ratio_to_interval": None if seconds is None else seconds / interval,
                       "message": (det.message or "")[:200]}
    for watch in running:
        watch.stop()
    return trial


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3, help="SIGKILLs, one per vLLM start (default 3)")
    parser.add_argument("--interval", type=float, default=None,
                        help="watch poll interval in s (default: the trainer's)")
    parser.add_argument("--grace", type=float, default=None,
                        help="external watch's grace in s (default: the trainer's)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the wait before each kill")
    parser.add_argument("--start-timeout", type=float, default=900.0,
                        help="seconds to wait for vLLM to start (default 900)")
    parser.add_argument("--json-out", type=Path, help="result file (default "
                        "benchmarks/results/bench_vllm_health_<date>.json)")
    args = parser.parse_args(argv)
    if args.kills < 1:
        parser.error(f"--kills must be at least 1, not {args.kills}")

    from atroposlib.inference.bundled import prepare_bundled_model
    from atroposlib.inference.vllm_process import VLLMProcess
    from example_trainer import health
    from example_trainer.config import TrainerConfig
    from example_trainer.vllm_sync import VLLMSync

    interval = args.interval if args.interval is not None else health.DEFAULT_INTERVAL_S
    grace = args.grace if args.grace is not None else health.DEFAULT_GRACE_S
    model = prepare_bundled_model()
    rng = random.Random(args.seed)
    trials = []
    with tempfile.TemporaryDirectory(prefix="bench-vllm-health-") as tmp:
        run_dir = Path(tmp)
        process = VLLMProcess(model, served_model_name="smollm2", dtype="float32",
                              max_model_len=2048, env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                              log_path=run_dir / "vllm.log")
        try:
            for kill in range(args.kills):
                begin = time.monotonic()
                process.start(timeout=args.start_timeout)
                start_s = time.monotonic() - begin
                launched = VLLMSync(TrainerConfig(model=str(model), run_dir=str(run_dir)), run_dir)
                launched.process = process  # what VLLMSync.start() sets after launching it
                external = VLLMSync(TrainerConfig(model=str(model), run_dir=str(run_dir),
                                                  vllm_url=process.base_url), run_dir)
                watches = {"launched": (launched.health_problem, grace),
                           "external": (external.health_problem, grace)}
                trial = one_kill(process, watches, rng, interval, wait=grace + 60)
                trial["vllm_start_s"] = start_s
                trials.append(trial)
                print(f"[health] kill {kill + 1}/{args.kills}: launched "
                      f"{trial['launched']['detected_s']} s, external "
                      f"{trial['external']['detected_s']} s (vLLM start {start_s:.0f} s)", flush=True)
                process.stop()  # the engine core outlives a SIGKILLed API server
        finally:
            process.stop()

    result = {"kills": args.kills, "interval_s": interval,
              "grace_s": grace, "model": "bundled SmolLM2-135M-Instruct, float32",
              "killed": "vLLM's API server process (VLLMProcess.proc.pid), SIGKILL",
              "trials": trials, "summary": {}}
    missed = 0
    for name in ("launched", "external"):
        seconds = [t[name]["detected_s"] for t in trials if t[name]["detected_s"] is not None]
        missed += len(trials) - len(seconds)
        result["summary"][name] = summary(seconds, interval)
        print(f"[health] {name}: {json.dumps(result['summary'][name])}")
    write_result(args.json_out or default_result_path("bench_vllm_health"), "bench_vllm_health",
                 result, seeds={"wait_before_kill": args.seed}, argv=command_argv(__file__, argv),
                 notes="The wait before each kill is 1 to 2 poll intervals, drawn from the seed, so "
                       "each kill lands at a random point of the watch's poll.")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
