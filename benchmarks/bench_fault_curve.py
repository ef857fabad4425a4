"""Learning under injected rollout faults: held-out accuracy with 10% of rollouts failing, over the clean run's.

Two runs of our GRPO loop on the quickstart (``atropos-launch`` with
``configs/quickstart-cpu-full.yaml``, the arithmetic env, the same training wall budget, as
``bench_learning.py`` runs its ``ours-<loss>`` contender), one after the other:

* ``clean``: no faults;
* ``faults``: the env runs with ``ATROPOS_FAULTS`` (see the Rollout outcomes guide): each
  rollout attempt fails with probability ``--rate`` (default 0.1), killed, timed out or with a
  corrupt inference reply (``--kinds``), seeded (``--fault-seed``).

Both use the same env seed (its training problems), the same ``--rollout-timeout`` and the same
``--policy`` (``failed_rollout_policy``, default ``retry``). The arithmetic env is a
``SingleTurnEnv``: its group's replies come from one request, and a fault hits a member's
scoring, so under ``retry`` a faulted member is scored again (its reply is kept) and the run
mostly pays the time of the retries and of the timeouts; ``shrink`` sends shrunk groups, which
pack into the quickstart's batches of 16 only beside groups that complete them (see the Rollout
outcomes guide), so it may stall. vLLM's sampling is not seeded, so
two clean runs differ too: compare the ratio with the spread of ``bench_learning.py --pairs``.
After both runs, ONE evaluator (``bench_learning``'s: HF generate, greedy, fp32) scores each
kept policy on the held-out problems. Printed: accuracy at each wall point for both runs and
their ratio ``faults / clean``, and the ratio of accuracy gained over the base model; written to
``benchmarks/results/bench_fault_curve_<date>.json`` with the faults injected and each run's
ledger (``summary.json``)::

    python benchmarks/bench_fault_curve.py --minutes 7
    python benchmarks/bench_fault_curve.py --minutes 14 --loss grpo --fault-seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/bench_fault_curve.py`
    sys.path.insert(0, str(ROOT))


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    from benchmarks.learning.ours import LOSSES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=7.0,
                        help="training wall budget of each run, in minutes")
    parser.add_argument("--rate", type=float, default=0.1,
                        help="probability that one rollout attempt fails (0..1)")
    parser.add_argument("--kinds", default="kill+timeout+corrupt",
                        help="faults to draw from, joined with +: kill, timeout, corrupt")
    parser.add_argument("--fault-seed", type=int, default=0, help="seed of the fault draws")
    parser.add_argument("--policy", choices=("retry", "shrink", "drop"), default="retry",
                        help="the env's failed_rollout_policy, in both runs")
    parser.add_argument("--rollout-timeout", type=float, default=60.0,
                        help="the env's rollout_timeout (s), in both runs: a timeout fault "
                             "holds its group this long. Keep it well above a group's sampling "
                             "time under load (about 15-30 s here with 8 groups in flight): at "
                             "20 s real timeouts starved the clean run too")
    parser.add_argument("--loss", choices=LOSSES, default="gspo",
                        help="the trainer's loss (bench_learning's ours-<loss>)")
    parser.add_argument("--task-difficulty", type=int, choices=(2, 4), default=2,
                        help="arithmetic difficulty: 2 (the quickstart's) or 4")
    parser.add_argument("--eval-size", type=int, default=None,
                        help="held-out problems scored (default 200; fewer for a quick check)")
    parser.add_argument("--eval-batch", type=int, default=100, help="evaluator batch size")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="run directories (default: runs/bench_fault_curve_runs)")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="result file (default: benchmarks/results/bench_fault_curve_<date>.json)")
    return parser


def ratios(clean: list[dict[str, float]], faults: list[dict[str, float]],
           base: float) -> list[dict[str, float | None]]:
    """The faulty run's curve over the clean one's, point by point.

    Args:
        clean, faults: ``[P]`` points ``{"minute", "accuracy"}`` at the same wall points.
        base: the base model's accuracy (point 0 of both).

    Returns:
        ``[P]`` ``{"minute", "clean", "faults", "ratio", "gain_ratio"}``: ``ratio`` is
        ``faults / clean`` accuracy, ``gain_ratio`` ``(faults - base) / (clean - base)``; None
        where the denominator is 0.

    Raises:
        ValueError: the curves are not at the same minutes.
    """
    if [p["minute"] for p in clean] != [p["minute"] for p in faults]:
        raise ValueError("the two runs were evaluated at different wall points")
    rows: list[dict[str, float | None]] = []
    for c, f in zip(clean, faults, strict=True):
        a, b = c["accuracy"], f["accuracy"]
        rows.append({"minute": c["minute"], "clean": a, "faults": b,
                     "ratio": b / a if a else None,
                     "gain_ratio": (b - base) / (a - base) if a != base else None})
    return rows


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    """Run clean, then with faults; evaluate both; print and write the ratio."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from atroposlib.envs.faults import FAULTS_ENV_VAR, FaultSpec
    from atroposlib.errors import ConfigError

    if args.minutes <= 0:
        parser.error(f"--minutes must be > 0, got {args.minutes}")
    work = (args.work_dir or Path("runs") / "bench_fault_curve_runs").resolve()
    faults_log = work / "faults" / "faults.jsonl"
    spec_text = f"rate={args.rate},kinds={args.kinds},seed={args.fault_seed},log={faults_log}"
    try:
        FaultSpec.parse(spec_text)
    except ConfigError as exc:
        parser.error(str(exc))
    from atroposlib.utils.offline import OFFLINE_ENV
    from benchmarks.learning.evaluate import EVAL_SIZE, evaluate_all
    from benchmarks.learning.ours import run_ours, task_shape
    from benchmarks.results import command_argv, default_result_path, write_result

    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.pop(FAULTS_ENV_VAR, None)
    from atroposlib.inference.bundled import is_prepared, prepare_bundled_model

    if not is_prepared():
        prepare_bundled_model()
    env_args = {"env.failed_rollout_policy": args.policy,
                "env.rollout_timeout": str(args.rollout_timeout)}
    name = f"ours-{args.loss}"
    runs: list[dict[str, Any]] = []
    for label in ("clean", "faults"):
        out = work / label
        if label == "faults":
            faults_log.parent.mkdir(parents=True, exist_ok=True)
            faults_log.unlink(missing_ok=True)
            os.environ[FAULTS_ENV_VAR] = spec_text  # atropos-launch hands it to the env
        print(f"[bench] {label}: {name}, {args.minutes:g} min", flush=True)
        try:
            result = run_ours(name, args.minutes, out, args.task_difficulty, None, env_args)
        finally:
            os.environ.pop(FAULTS_ENV_VAR, None)
        summary = json.loads((out / name / "summary.json").read_text())
        runs.append({"label": label, "budget_minutes": args.minutes, **result,
                     "ledger": summary.get("ledger")})
    eval_size = evaluate_all(runs, args.task_difficulty, args.eval_batch, args.eval_size or EVAL_SIZE)
    clean, faulty = runs
    rows = ratios(clean["curve"], faulty["curve"], clean["accuracy_base"])
    injected = [json.loads(line) for line in faults_log.read_text().splitlines()] \
        if faults_log.exists() else []
    print(f"[bench] {len(injected)} faults injected at rate {args.rate} ({args.kinds}), "
          f"policy {args.policy}; steps: clean {clean['steps']}, faults {faulty['steps']}")
    print(f"{'minute':>7} {'clean':>7} {'faults':>7} {'ratio':>7} {'gain ratio':>10}")
    for row in rows:
        print(f"{row['minute']:>7.2f} {_fmt(row['clean']):>7} {_fmt(row['faults']):>7} "
              f"{_fmt(row['ratio']):>7} {_fmt(row['gain_ratio']):>10}")
    from atroposlib.environments.arithmetic_server import ArithmeticEnvConfig

    env_cfg = ArithmeticEnvConfig(difficulty=args.task_difficulty)
    write_result(args.json_out or default_result_path("bench_fault_curve"), "bench_fault_curve", {
        "task": {"model": "SmolLM2-135M-Instruct (bundled)", "env": "arithmetic",
                 "difficulty": args.task_difficulty, **task_shape(), "eval_problems": eval_size,
                 "minutes": args.minutes, "loss": args.loss},
        "faults": {"rate": args.rate, "kinds": args.kinds, "policy": args.policy,
                   "rollout_timeout": args.rollout_timeout, "injected": len(injected),
                   "by_kind": {k: sum(f["kind"] == k for f in injected)
                               for k in args.kinds.split("+")}},
        "ratios": rows, "runs": runs,
    }, seeds={"env (training problems)": env_cfg.seed, "held-out problems": env_cfg.eval_seed,
              "faults": args.fault_seed, "evaluation": "greedy", "sampling": "unseeded (vLLM)"},
        argv=command_argv(__file__, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
