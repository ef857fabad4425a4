"""Learning speed: held-out accuracy gained per training minute, our GRPO loop against TRL.

Every contender trains the bundled SmolLM2-135M-Instruct on the arithmetic task
(``--task-difficulty``: 2 = a + b with operands 1..20, the quickstart's; 4 = + and - with
operands 1..99, where neither side saturates), replies of at most 24 tokens, groups of 8, 16
sequences a step, the top 10 layers and the final norm trainable, for the same training wall
budget of ``--minutes``. Contenders run one after another (never concurrently). The policy each
one holds at the wall points 0, M/4, M/2, 3M/4 and M of its training clock is kept, and after all
runs ONE evaluator (HF generate, greedy, fp32, eager attention) scores every kept policy on up
to 200 held-out problems with the environment's own ``score_reply``. Evaluation time is outside
every budget.

* ``ours-<loss>`` (and ``ours-grpo-tis``; ``ours-<loss>-lora`` runs the quickstart itself,
  ``configs/quickstart-cpu.yaml``, LoRA adapters on the top 10 layers):
  ``atropos-launch`` with ``configs/quickstart-cpu-full.yaml`` (the quickstart fully fine-tuned:
  run-api, the trainer with its vLLM, the arithmetic env), ``--loss-type <loss>``, ``--max-train-seconds 60*M``, no periodic
  evaluations. The clock starts when the trainer registers with run-api (model loading and vLLM
  start-up are outside it, as TRL's model loading is). At each wall point the bench copies what
  the trainer last pushed to vLLM (the final checkpoint after the trainer stopped): the weights,
  or for a LoRA run that pushes its adapter alone (``weight_sync: auto``) the adapter, which the
  evaluator merges into the bundled model in fp32. Each curve point's ``policy`` says which.
* ``ours-gspo-node``: ``ours-gspo`` trained through ``atropos-inference-node`` in its own mount
  namespace (tmpfs over the run directory and /tmp: every weight update goes over HTTP). Its
  weights are never on the bench's disk during the run, so only the points 0 and M are scored;
  the node's memory is not in the contender's peak RSS::

    python benchmarks/bench_learning.py --minutes 7 --contenders ours-gspo,ours-gspo-node

* ``trl``: TRL's ``GRPOTrainer`` with its own HF generation on CPU, the same prompts (the env's
  training split), the env's reward, ``GRPOConfig(per_device_train_batch_size=16,
  num_generations=8, max_completion_length=24, loss_type="grpo", beta=0.0, epsilon=0.2,
  temperature=1.0, use_cpu=True)`` and the setting's ``learning_rate``, ``bf16`` and
  ``importance_sampling_level`` (``--trl-setting``, or the best of a sweep: ``--trl-best-from``).
  ``--trl-setting ...,lora=16`` gives TRL peft LoRA adapters placed as the quickstart's (its
  target modules and top layers, its alpha/r), the like-for-like peer of ``ours-gspo-lora``.
  A callback keeps the clock from ``on_train_begin``, saves the trainable weights at each wall
  point (saving time is subtracted) and stops training when the next step would end past the
  budget, like our trainer's ``--max-train-seconds``. For both, a step that ends past the
  budget counts neither in the point M nor in samples/s.
* ``--trl-sweep``: TRL with each of its 8 settings (lr 3e-5 / 6e-5, bf16 off / on, token /
  sequence level); the JSON records every setting's row and the best (highest mean final
  accuracy) under ``trl_sweep``.
* ``--pairs N --alternate``: the contender list runs N times, every other pass in reverse
  order; each row then gives the mean and the spread [min-max] over its N runs.
* ``--merge A.json B.json ...``: runs nothing; one table from the runs of several JSONs of the
  same task and budget (pairs measured on different days, a sweep run in parts). A merged
  sweep's best is recomputed over all its TRL rows, so ``--trl-best-from`` takes it too.

Reported per contender: accuracy at each wall point, steps, samples (sequences) trained per
second, peak RSS of its whole process tree and of each part (trainer, vllm-api, vllm-engine,
vllm-worker, env, run-api, launcher; TRL is one process), and for ours the share of sampled
groups the env dropped as all-same scores; plus a PNG of accuracy against training minutes::

    python benchmarks/bench_learning.py --minutes 2 --contenders ours-gspo,trl      # memory
    python benchmarks/bench_learning.py --task-difficulty 4 --minutes 7 --trl-sweep \
        --contenders "" --json-out runs/trl_sweep_d4.json
    python benchmarks/bench_learning.py --task-difficulty 4 --minutes 14 --contenders ours-gspo,trl \
        --trl-best-from runs/trl_sweep_d4.json --pairs 3 --alternate --json-out runs/fair_d4.json

Every child runs offline, in its own session, under a timeout; on exit (also Ctrl-C or SIGTERM)
the bench terminates them and everything they spawned, by pid.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/bench_learning.py`
    sys.path.insert(0, str(ROOT))

from atroposlib.utils.offline import OFFLINE_ENV  # noqa: E402
from benchmarks.learning.ours import OURS  # noqa: E402
from benchmarks.learning.trl_side import SWEEP, TrlSetting  # noqa: E402
from benchmarks.process_tree import LIVE  # noqa: E402
from benchmarks.results import command_argv  # noqa: E402

CONTENDERS = (*OURS, "trl")


def _key_values(parser: argparse.ArgumentParser, items: list[str], flag: str) -> dict[str, str]:
    bad = [a for a in items if "=" not in a]
    if bad:
        parser.error(f"{flag} takes KEY=VALUE, got {bad}")
    return dict(a.split("=", 1) for a in items)


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=14.0,
                        help="training wall budget of every contender, in minutes")
    parser.add_argument("--task-difficulty", type=int, choices=(2, 4), default=2,
                        help="arithmetic difficulty: 2 (the quickstart's) or 4 (+/- to 99)")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="result file (default: benchmarks/results/bench_learning_<date>.json)")
    parser.add_argument("--plot-out", type=Path, default=None,
                        help="PNG of accuracy against wall time (default: next to --json-out)")
    parser.add_argument("--contenders", default="ours-gspo,trl",
                        help=f"comma-separated, from {', '.join(CONTENDERS)} (may be empty with "
                             "--trl-sweep)")
    parser.add_argument("--pairs", type=int, default=1,
                        help="run the contender list this many times (paired runs)")
    parser.add_argument("--alternate", action="store_true",
                        help="reverse the contender order on every other pass")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="run directories (default: runs/bench_learning_runs)")
    parser.add_argument("--eval-batch", type=int, default=100, help="evaluator batch size")
    parser.add_argument("--trl-setting", default="lr=3e-5,bf16=0,level=token",
                        help="TRL's knobs for `trl`: lr=FLOAT,bf16=0|1,level=token|sequence,lora=RANK "
                             "(LoRA adapters placed as the quickstart's; 0: the top layers whole)")
    parser.add_argument("--trl-best-from", type=Path, default=None,
                        help="take `trl`'s setting from this --trl-sweep JSON (its best)")
    parser.add_argument("--trl-sweep", nargs="?", const="all", default=None,
                        help="also run TRL with each of its 8 sweep settings (or only these: "
                             "'lr=..,bf16=..,level=..;...'); record the best in the JSON")
    parser.add_argument("--eval-size", type=int, default=None,
                        help="held-out problems the evaluator scores (default 200; fewer for a "
                             "quick check)")
    parser.add_argument("--ours-lr", type=float, default=None,
                        help="our contenders' learning rate (default: their quickstart config's)")
    parser.add_argument("--ours-env-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="an env arg for our contenders (repeatable), e.g. "
                             "env.item_filter.enabled=true")
    parser.add_argument("--ours-trainer-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a trainer setting for our contenders (repeatable, YAML value), "
                             "e.g. vllm_kv_cache_gib=2")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                        help="run nothing: combine the runs of these bench JSONs (the same task and "
                             "minutes, e.g. pairs measured on different days, or a sweep in parts) "
                             "into one table at --json-out")
    parser.add_argument("--trl-worker", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the contenders, evaluate every kept policy, print and write the table."""
    import yaml

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.json_out is None:
        from benchmarks.results import default_result_path

        args.json_out = default_result_path("bench_learning")
    if args.minutes <= 0:
        parser.error(f"--minutes must be > 0, got {args.minutes}")
    if args.pairs < 1:
        parser.error(f"--pairs must be >= 1, got {args.pairs}")
    try:
        setting = TrlSetting.parse(args.trl_setting)
    except ValueError as exc:
        parser.error(str(exc))
    if args.merge is not None:
        return merge_jsons(parser, args, argv)
    if args.trl_worker is not None:
        from benchmarks.learning.trl_side import trl_worker

        trl_worker(args.trl_worker, args.minutes, args.task_difficulty, setting)
        return 0
    if args.trl_best_from is not None:
        from benchmarks.learning.trl_side import best_setting

        try:
            setting = best_setting(args.trl_best_from)
        except (OSError, ValueError) as exc:
            parser.error(f"--trl-best-from: {exc}")
    env_args = _key_values(parser, args.ours_env_arg, "--ours-env-arg")
    trainer_args = {k: yaml.safe_load(v) for k, v in
                    _key_values(parser, args.ours_trainer_arg, "--ours-trainer-arg").items()}
    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown or not (names or args.trl_sweep):
        parser.error(f"unknown contenders {unknown}; choose from {', '.join(CONTENDERS)}")
    # a pass: (label, how to run it) in order
    plan: list[tuple[str, Any]] = [(setting.name if n == "trl" else n, setting if n == "trl" else n)
                                   for n in names]
    sweep: tuple[TrlSetting, ...] = ()
    if args.trl_sweep:
        try:
            sweep = SWEEP if args.trl_sweep == "all" else tuple(
                TrlSetting.parse(part) for part in args.trl_sweep.split(";") if part.strip())
        except ValueError as exc:
            parser.error(f"--trl-sweep: {exc}")
        plan += [(s.name, s) for s in sweep if s.name not in {label for label, _ in plan}]
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    from atroposlib.inference.bundled import is_prepared, prepare_bundled_model

    if not is_prepared():
        prepare_bundled_model()
    work = args.work_dir or Path("runs") / "bench_learning_runs"
    work.mkdir(parents=True, exist_ok=True)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    runs = run_passes(plan, args, work, env_args, trainer_args)
    if runs is None:
        return 130
    from benchmarks.learning.evaluate import EVAL_SIZE, evaluate_all
    from benchmarks.learning.ours import task_shape
    from benchmarks.learning.report import report, sweep_summary

    eval_size = evaluate_all(runs, args.task_difficulty, args.eval_batch, args.eval_size or EVAL_SIZE)
    task = {"model": "SmolLM2-135M-Instruct (bundled)", "env": "arithmetic",
            "difficulty": args.task_difficulty, **task_shape(), "eval_problems": eval_size,
            "minutes": args.minutes, "pairs": args.pairs, "alternate": args.alternate,
            "order": [label for label, _ in plan]}
    extra: dict[str, Any] = {}
    if args.trl_sweep:
        try:
            extra["trl_sweep"] = sweep_summary(runs, [s.record() for s in sweep])
            print(f"[bench] TRL's best setting: {extra['trl_sweep']['best']['label']}", flush=True)
        except ValueError as exc:  # every sweep run failed: the table still gets written
            print(f"[bench] {exc}", flush=True)
    from atroposlib.environments.arithmetic_server import ArithmeticEnvConfig

    env_cfg = ArithmeticEnvConfig(difficulty=args.task_difficulty)
    seeds = {"env (training problems, ours and TRL)": env_cfg.seed, "held-out problems": env_cfg.eval_seed,
             "TRL GRPOConfig": 0, "evaluation": "greedy", "ours' sampling": "unseeded (vLLM)"}
    report(runs, task, args.json_out, args.plot_out or args.json_out.with_suffix(".png"), extra, seeds=seeds,
           argv=command_argv(__file__, argv))
    return 0


def merge_jsons(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """``--merge``: one table (JSON and PNG at ``--json-out``) from the runs of several JSONs."""
    import json

    from benchmarks.learning.report import merge, report

    try:
        payloads = [(path.name, json.loads(path.read_text())) for path in args.merge]
        runs, task, extra = merge(payloads)
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        parser.error(f"--merge: {exc}")
    seeds = next((p["meta"]["seeds"] for _, p in payloads if "meta" in p), "those of the merged files")
    report(runs, task, args.json_out, args.plot_out or args.json_out.with_suffix(".png"), extra, seeds=seeds,
           argv=command_argv(__file__, argv))
    return 0


def run_passes(plan: list[tuple[str, Any]], args: argparse.Namespace, work: Path,
               env_args: dict[str, str], trainer_args: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Run the plan ``args.pairs`` times (every other pass reversed with ``--alternate``).

    Returns:
        Every run (``label``, ``pass``, ``budget_minutes`` and the runner's result), or None
        when interrupted.
    """
    from benchmarks.learning.ours import run_ours
    from benchmarks.learning.trl_side import run_trl

    runs: list[dict[str, Any]] = []
    try:
        for i in range(args.pairs):
            order = plan[::-1] if args.alternate and i % 2 else plan
            for label, what in order:
                print(f"[bench] pass {i + 1}/{args.pairs}: {label}, {args.minutes:g} min", flush=True)
                begin = time.monotonic()
                out = work / f"pass{i + 1}"
                try:
                    result = (run_trl(what, args.minutes, out, args.task_difficulty)
                              if isinstance(what, TrlSetting)
                              else run_ours(what, args.minutes, out, args.task_difficulty, args.ours_lr,
                                            env_args, trainer_args))
                except RuntimeError as exc:  # one contender failing does not lose the others
                    print(f"[bench] {label} FAILED, left out of the table: {exc}", flush=True)
                    continue
                runs.append({"label": label, "pass": i + 1, "budget_minutes": args.minutes, **result})
                print(f"[bench] {label}: {result['steps']} steps, {result['sequences']} sequences in "
                      f"{result['train_seconds']:.0f}s of training ({time.monotonic() - begin:.0f}s "
                      f"with start-up); peak RSS {result['peak_rss_bytes'] / 2**30:.2f} GiB "
                      f"{ {k: round(v / 2**30, 2) for k, v in result['peak_rss_by_part'].items()} }; "
                      f"at the peak: { {k: round(v / 2**30, 2) for k, v in result['rss_by_part_at_peak'].items()} }",
                      flush=True)
                if result.get("other_cmdlines"):
                    print(f"[bench] {label}: processes counted as other (peak GiB): "
                          f"{ {k: round(v / 2**30, 2) for k, v in result['other_cmdlines'].items()} }", flush=True)
    except KeyboardInterrupt:
        print("[bench] interrupted: stopping the running contender", flush=True)
        return None
    finally:
        for tree in list(LIVE):
            tree.stop()
    return runs


def _on_signal(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    raise SystemExit(main())
