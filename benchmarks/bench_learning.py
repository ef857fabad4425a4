"""Learning speed: held-out accuracy gained per training minute, our GRPO loop against TRL.

Every contender trains the bundled SmolLM2-135M-Instruct on the quickstart task (arithmetic at
difficulty 2, replies of at most 24 tokens, groups of 8, 16 sequences a step, the top 10 layers
and the final norm trainable) for the same training wall budget of ``--minutes``; TRL at lr 3e-5,
ours at the quickstart's lr (each contender's lr is in the JSON).
Contenders run one after another (never concurrently). The policy each one holds at the wall
points 0, M/4, M/2, 3M/4 and M of its training clock is kept, and after all runs ONE evaluator
(HF generate, greedy, fp32, eager attention, one padded batch) scores every kept policy on the
environment's 105 held-out problems with the environment's own ``score_reply``. Evaluation time
is outside every budget.

* ``ours-<loss>`` (and ``ours-grpo-tis``; ``ours-grpo-lora`` runs ``configs/quickstart-cpu-lora.yaml``,
  LoRA adapters merged into each synced policy): ``atropos-launch`` with ``configs/quickstart-cpu.yaml``
  (run-api, the trainer with its vLLM, the arithmetic env), ``--loss-type <loss>``,
  ``--max-train-seconds 60*M``, no periodic evaluations. The training clock starts when the
  trainer registers with run-api (model loading and vLLM start-up are outside it, as TRL's model
  loading is). At each wall point the bench copies the weights the trainer last pushed to vLLM
  (the final checkpoint for points after the trainer stopped).
* ``trl``: TRL's ``GRPOTrainer`` with its own HF generation on CPU, the same prompts (the env's
  training split), the env's reward, ``GRPOConfig(per_device_train_batch_size=16,
  num_generations=8, max_completion_length=24, learning_rate=3e-5, loss_type="grpo", beta=0.0,
  epsilon=0.2, temperature=1.0, use_cpu=True)``. A callback keeps the clock from
  ``on_train_begin``, saves the trainable weights held at each wall point (saving time is
  subtracted from the clock) and stops training when the next step would end past the budget,
  like our trainer's ``--max-train-seconds``. For both, a step that ends past the budget counts
  neither in the point M nor in samples/s.

Reported per contender: accuracy before and after, points gained per training minute, samples
(sequences) trained per second, peak RSS of its whole process tree (vLLM, envs and run-api
included for ours), the accuracy curve; plus a PNG of accuracy against training minutes::

    python benchmarks/bench_learning.py --minutes 15 --json-out runs/bench_learning.json
    python benchmarks/bench_learning.py --minutes 1 --contenders ours-grpo,trl

Every child runs offline, in its own session, under a timeout; on exit (also Ctrl-C or SIGTERM)
the bench terminates them and everything they spawned, by pid.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/bench_learning.py`
    sys.path.insert(0, str(ROOT))

from atroposlib.utils.offline import OFFLINE_ENV  # noqa: E402
from benchmarks.process_tree import LIVE, Tree  # noqa: E402

QUICKSTART = ROOT / "configs" / "quickstart-cpu.yaml"
QUICKSTART_LORA = ROOT / "configs" / "quickstart-cpu-lora.yaml"
LOSSES = ("grpo", "dr_grpo", "dapo", "gspo", "cispo")
CONTENDERS = (*(f"ours-{loss}" for loss in LOSSES), "ours-grpo-tis", "ours-grpo-lora", "trl")
POINTS = (0.0, 0.25, 0.5, 0.75, 1.0)  # wall points, as fractions of the budget
DIFFICULTY, GROUP_SIZE, MAX_TOKENS, BATCH_SIZE, TRAIN_LAYERS, LR = 2, 8, 24, 16, 10, 3e-5
#: seconds a contender may take beyond its budget (model load, vLLM start, final save)
STARTUP_ALLOWANCE = 900.0


# --------------------------------------------------------------------------- our loop
def run_ours(name: str, minutes: float, out: Path, lr: float | None = None,
             env_args: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``atropos-launch`` on the quickstart config with the contender's objective.

    ``lr`` replaces the config's learning rate when given; ``env_args`` are added to (or
    replace) every env's ``args`` (e.g. ``{"env.zero_variance_keep": "0.5"}``).

    Returns:
        ``{"points": {fraction: model path}, "steps", "sequences", "train_seconds",
        "peak_rss_bytes"}``.

    Raises:
        RuntimeError: the launch failed (message names its log).
    """
    import yaml

    from atroposlib.utils.yaml_file import load_yaml

    loss = name.removeprefix("ours-").removesuffix("-tis").removesuffix("-lora")
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    (run_dir / "points").mkdir(parents=True)
    config = load_yaml(QUICKSTART_LORA if name.endswith("-lora") else QUICKSTART)
    budget = 60.0 * minutes
    config["trainer"].update(training_steps=100_000, max_train_seconds=budget, loss_type=loss,
                             is_correction="tis" if name.endswith("-tis") else "none",
                             eval_interval=0, checkpoint_interval=0)
    if lr is not None:
        config["trainer"]["lr"] = lr
    config.pop("eval_env", None)  # evaluation happens after the run, with one evaluator
    config["run_dir"] = str(run_dir)
    for env in config["envs"]:
        env["script"] = str((ROOT / env["script"]).resolve())
        env["args"] = {**env.get("args", {}), **(env_args or {})}
    cfg_path = run_dir / "launch.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "atroposlib.cli.launch", str(cfg_path)]
    with Tree(argv, run_dir / "bench.log") as tree:
        trainer_log = run_dir / "logs" / "trainer.log"
        deadline = time.monotonic() + STARTUP_ALLOWANCE
        while "[grpo] registered with" not in _read(trainer_log):
            if tree.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name}: the trainer never registered; see {trainer_log}")
            time.sleep(0.5)
        start = time.monotonic()
        reached: dict[float, tuple[str | None, int]] = {}
        for frac in POINTS[1:]:
            while time.monotonic() - start < frac * budget and tree.proc.poll() is None:
                time.sleep(0.2)
            if tree.proc.poll() is None:
                snapshot = _snapshot_sync_weights(run_dir, run_dir / "points" / f"{frac:.2f}")
                # no weights although steps were logged: the trainer has just finished and
                # removed them, so the final checkpoint (the default below) is the policy
                if snapshot[0] is not None or not _read(run_dir / "metrics.jsonl").strip():
                    reached[frac] = snapshot
        code = tree.wait(budget + STARTUP_ALLOWANCE)
    if code != 0:
        raise RuntimeError(f"{name}: atropos-launch exited with {code}; see {run_dir}/logs")
    summary = json.loads((run_dir / "summary.json").read_text())
    history = [json.loads(line) for line in _read(run_dir / "metrics.jsonl").splitlines() if line]
    final = str(run_dir / "checkpoints" / "final")
    # a point after the trainer had stopped holds the final policy; a step that ended past the
    # budget (its length misjudged) is not counted: the point M is the policy at M
    points = {0.0: None, **{f: reached[f][0] if f in reached else final for f in POINTS[1:]}}
    if 1.0 in reached:
        history, seconds = history[:reached[1.0][1]], budget
    else:
        seconds = min(summary["train_loop_seconds"], budget)
    return {"points": points, "steps": len(history),
            "sequences": sum(h.get("sequences", 0) for h in history),
            "train_seconds": seconds, "peak_rss_bytes": tree.peak_rss, "lr": config["trainer"]["lr"],
            "env_args": env_args or {}}


def _snapshot_sync_weights(run_dir: Path, dest: Path) -> tuple[str | None, int]:
    """Copy the weights the trainer last pushed to vLLM, never a half-written file.

    The trainer rewrites ``vllm_weights/model.safetensors`` in place after each step (in a
    background thread with ``--weight-sync-overlap``), which takes well under a second. A copy is
    kept only if the file was last written at least a second before the copy began and did not
    change during it; the steps finished are the lines of ``metrics.jsonl`` when it began (each
    step's line is written right after its weights start to be written). Before the first step
    the starting model is the policy, so nothing is copied (the evaluator then uses the bundled
    model).

    Returns:
        ``(dest, steps)``: the model directory (None when no step has finished yet, the
        starting model is the policy) and the steps finished when it was copied.

    Raises:
        RuntimeError: no consistent copy within about two minutes.
    """
    weights = run_dir / "vllm_weights" / "model.safetensors"
    metrics = run_dir / "metrics.jsonl"
    for _ in range(480):
        if not weights.exists() or not metrics.exists():
            return None, 0
        before = weights.stat().st_mtime_ns
        if time.time_ns() - before >= 1_000_000_000:
            steps = len(_read(metrics).splitlines())
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(weights, dest / "model.safetensors")
            shutil.copy2(run_dir / "vllm_weights" / "config.json", dest / "config.json")
            if weights.stat().st_mtime_ns == before:
                return str(dest), steps
        time.sleep(0.25)
    raise RuntimeError(f"could not take a consistent copy of {weights}")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


# --------------------------------------------------------------------------- TRL
def run_trl(minutes: float, out: Path, lr: float = LR) -> dict[str, Any]:
    """Run the TRL contender in a child process (``--trl-worker``); same return as :func:`run_ours`."""
    run_dir = out / "trl"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    budget = 60.0 * minutes
    with Tree([sys.executable, str(Path(__file__).resolve()), "--trl-worker", str(run_dir),
               "--minutes", str(minutes), "--trl-lr", str(lr)], run_dir / "bench.log") as tree:
        code = tree.wait(budget + STARTUP_ALLOWANCE)
    if code != 0:
        raise RuntimeError(f"trl: the worker exited with {code}; see {run_dir}/bench.log")
    result = json.loads((run_dir / "result.json").read_text())
    points = {float(k): v for k, v in result["points"].items()}
    return {"points": points, "steps": result["steps"], "sequences": result["sequences"],
            "train_seconds": result["train_seconds"], "peak_rss_bytes": tree.peak_rss, "lr": lr}


def trl_worker(run_dir: Path, minutes: float, lr: float = LR) -> None:
    """Train with TRL's GRPOTrainer for ``minutes``; write trainable weights at the wall points."""
    import random

    import torch
    from datasets import Dataset
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from atroposlib.environments.arithmetic_server import (
        ArithmeticEnv,
        ArithmeticEnvConfig,
        make_problem,
    )
    from atroposlib.inference.bundled import bundled_model_dir
    from example_trainer.grpo import freeze_all_but_last_layers

    env_cfg = ArithmeticEnvConfig(difficulty=DIFFICULTY)
    model_dir = str(bundled_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager")
    freeze_all_but_last_layers(model, TRAIN_LAYERS)
    eos_ids = _eos_ids(model, tokenizer)
    rng = random.Random(env_cfg.seed)  # the env's training split, drawn like the env draws it
    problems = [make_problem(rng, DIFFICULTY, False, env_cfg.heldout_fraction) for _ in range(20_000)]
    dataset = Dataset.from_list([{"prompt": ArithmeticEnv.messages(p), "answer": p["answer"]}
                                 for p in problems])

    def arithmetic_reward(completions: list, completion_ids: list, answer: list, **_: Any) -> list[float]:
        return [_score_completion(c, ids, a, eos_ids)
                for c, ids, a in zip(completions, completion_ids, answer, strict=True)]

    budget = 60.0 * minutes
    points_dir = run_dir / "points"
    points_dir.mkdir(parents=True, exist_ok=True)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    class WallClock(TrainerCallback):
        """Training clock without saving time; saves at the wall points; stops within the budget."""

        def __init__(self) -> None:
            self.start = 0.0
            self.paused = 0.0
            self.last_step = 0.0
            self.step_begin = 0.0
            self.pre_step: dict[str, torch.Tensor] = {}
            self.saved: dict[float, str | None] = {0.0: None}
            self.steps = 0  # steps that ended within the budget
            self.seconds = 0.0  # training seconds those steps took (the budget if still going at M)

        def elapsed(self) -> float:
            return time.monotonic() - self.start - self.paused

        def save(self, frac: float, state: dict[str, torch.Tensor]) -> None:
            begin = time.monotonic()
            path = points_dir / f"{frac:.2f}.safetensors"
            save_file({k: v.contiguous() for k, v in state.items()}, str(path))
            self.saved[frac] = str(path)
            self.paused += time.monotonic() - begin

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.monotonic()

        def on_step_begin(self, args, state, control, **kwargs):
            begin = time.monotonic()
            self.pre_step = {n: p.detach().clone() for n, p in trainable}
            self.paused += time.monotonic() - begin
            self.step_begin = self.elapsed()

        def on_step_end(self, args, state, control, **kwargs):
            now = self.elapsed()
            self.last_step = now - self.step_begin
            for frac in POINTS[1:]:  # a point this step crossed: the policy before it
                if frac not in self.saved and now > frac * budget:
                    self.save(frac, self.pre_step)
            if now <= budget:
                self.steps, self.seconds = self.steps + 1, now
            else:  # this step's length was misjudged: the point M holds the policy before it
                self.seconds = budget
            if now + self.last_step > budget:  # the next step would end past the budget
                control.should_training_stop = True
            return control

        def finish(self) -> None:
            current = {n: p.detach() for n, p in trainable}
            for frac in POINTS[1:]:
                if frac not in self.saved:
                    self.save(frac, current)

    clock = WallClock()
    config = GRPOConfig(
        output_dir=str(run_dir / "trl_output"), per_device_train_batch_size=BATCH_SIZE,
        num_generations=GROUP_SIZE, max_completion_length=MAX_TOKENS, learning_rate=lr,
        loss_type="grpo", beta=0.0, epsilon=0.2, temperature=1.0, use_cpu=True,
        max_steps=100_000, save_strategy="no", report_to="none", logging_steps=1,
        dataloader_num_workers=0, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=arithmetic_reward, args=config,
                          train_dataset=dataset, processing_class=tokenizer, callbacks=[clock])
    trainer.train()
    clock.finish()
    (run_dir / "result.json").write_text(json.dumps({
        "points": {str(k): v for k, v in clock.saved.items()}, "steps": clock.steps,
        "sequences": clock.steps * BATCH_SIZE, "train_seconds": clock.seconds}))


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Token ids that end a reply: the tokenizer's EOS plus the generation config's."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen = getattr(model.generation_config, "eos_token_id", None)
    ids |= set(gen) if isinstance(gen, list) else ({gen} if gen is not None else set())
    return ids


def _score_completion(completion: Any, ids: list[int], answer: int, eos_ids: set[int]) -> float:
    """The env's reward for one TRL completion: a reply that did not end with EOS scores 0."""
    from atroposlib.environments.arithmetic_server import score_reply

    text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
    stopped = bool(ids) and ids[-1] in eos_ids
    return score_reply(text, answer, "stop" if stopped else "length")


# --------------------------------------------------------------------------- evaluation
def evaluate_all(results: dict[str, dict[str, Any]], eval_batch: int) -> float:
    """Score every kept policy with ONE evaluator; fills ``result["curve"]``; returns base accuracy."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from atroposlib.environments.arithmetic_server import (
        ArithmeticEnv,
        ArithmeticEnvConfig,
        heldout_problems,
        score_reply,
    )
    from atroposlib.inference.bundled import bundled_model_dir

    base_dir = str(bundled_model_dir())
    env_cfg = ArithmeticEnvConfig(difficulty=DIFFICULTY, eval_size=200)
    problems = heldout_problems(DIFFICULTY, env_cfg.heldout_fraction, env_cfg.eval_size,
                                env_cfg.eval_seed)
    tokenizer = AutoTokenizer.from_pretrained(base_dir, padding_side="left")
    prompts = [tokenizer.apply_chat_template(ArithmeticEnv.messages(p), tokenize=False,
                                             add_generation_prompt=True) for p in problems]

    def accuracy(path: str | None) -> float:
        model = AutoModelForCausalLM.from_pretrained(
            path if path and Path(path).is_dir() else base_dir, dtype=torch.float32,
            attn_implementation="eager").eval()
        if path and path.endswith(".safetensors"):  # TRL point: trainable weights only
            unexpected = model.load_state_dict(load_file(path), strict=False).unexpected_keys
            if unexpected:
                raise RuntimeError(f"{path} holds weights the model lacks: {unexpected[:3]}")
        eos_ids = _eos_ids(model, tokenizer)
        correct = 0.0
        for i in range(0, len(prompts), eval_batch):
            enc = tokenizer(prompts[i:i + eval_batch], return_tensors="pt", padding=True,
                            add_special_tokens=False)
            with torch.no_grad():
                out = model.generate(**enc, do_sample=False, max_new_tokens=MAX_TOKENS,
                                     pad_token_id=tokenizer.pad_token_id or 0,
                                     eos_token_id=sorted(eos_ids))
            for row, prob in zip(out[:, enc["input_ids"].shape[1]:].tolist(), problems[i:i + eval_batch],
                                 strict=True):
                cut = next((j for j, t in enumerate(row) if t in eos_ids), None)
                text = tokenizer.decode(row[:cut], skip_special_tokens=True)
                correct += score_reply(text, prob["answer"], "length" if cut is None else "stop")
        return correct / len(problems)

    print(f"[bench] evaluating {len(problems)} held-out problems per policy", flush=True)
    base = accuracy(None)
    print(f"[bench] base model: {base:.3f}", flush=True)
    for name, result in results.items():
        budget_min = result["budget_minutes"]
        curve = []
        for frac in POINTS:
            path = result["points"].get(frac)
            acc = base if path is None else accuracy(path)
            curve.append({"minute": frac * budget_min, "accuracy": acc})
            print(f"[bench] {name} at {frac * budget_min:.2f} min: {acc:.3f}", flush=True)
        result["curve"] = curve
    return base


# --------------------------------------------------------------------------- report
def report(results: dict[str, dict[str, Any]], json_out: Path, plot_out: Path) -> dict[str, Any]:
    """Print the side-by-side table, write the JSON and the accuracy-vs-time PNG."""
    table: dict[str, Any] = {}
    for name, r in results.items():
        before, after = r["curve"][0]["accuracy"], r["curve"][-1]["accuracy"]
        minutes = r["train_seconds"] / 60.0
        table[name] = {
            "accuracy_before": before, "accuracy_after": after, "minutes": minutes,
            "points_per_minute": 100.0 * (after - before) / minutes if minutes else math.nan,
            "samples_per_second": r["sequences"] / r["train_seconds"] if r["train_seconds"] else 0.0,
            "peak_rss_bytes": r["peak_rss_bytes"], "steps": r["steps"],
            "budget_minutes": r["budget_minutes"], "lr": r.get("lr"),
            "env_args": r.get("env_args", {}), "curve": r["curve"]}
    header = f"{'contender':<16} {'before':>7} {'after':>7} {'minutes':>8} {'pts/min':>8} " \
             f"{'samples/s':>10} {'steps':>6} {'peak RSS':>9}"
    print(header)
    for name, row in table.items():
        print(f"{name:<16} {row['accuracy_before']:>7.3f} {row['accuracy_after']:>7.3f} "
              f"{row['minutes']:>8.2f} {row['points_per_minute']:>8.2f} "
              f"{row['samples_per_second']:>10.3f} {row['steps']:>6} "
              f"{row['peak_rss_bytes'] / 2**30:>7.2f}GB")
    payload = {"contenders": table, "task": {
        "model": "SmolLM2-135M-Instruct (bundled)", "env": "arithmetic", "difficulty": DIFFICULTY,
        "max_tokens": MAX_TOKENS, "group_size": GROUP_SIZE, "batch_size": BATCH_SIZE,
        "trainable_layers": TRAIN_LAYERS}}
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(payload, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, row in table.items():
        ax.plot([p["minute"] for p in row["curve"]], [p["accuracy"] for p in row["curve"]],
                marker="o", label=name)
    ax.set_xlabel("training wall time (minutes)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title("arithmetic (difficulty 2), SmolLM2-135M, same budget")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(plot_out, dpi=120)
    plt.close(fig)
    print(f"[bench] wrote {json_out} and {plot_out}", flush=True)
    return payload


# --------------------------------------------------------------------------- main
def _on_signal(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """``bench_learning.py --minutes M --json-out FILE [--contenders a,b]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=15.0,
                        help="training wall budget of every contender, in minutes")
    parser.add_argument("--json-out", type=Path, default=Path("runs/bench_learning.json"))
    parser.add_argument("--plot-out", type=Path, default=None,
                        help="PNG of accuracy against wall time (default: next to --json-out)")
    parser.add_argument("--contenders", default=",".join(CONTENDERS),
                        help=f"comma-separated, from {', '.join(CONTENDERS)}")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="run directories (default: <json-out dir>/bench_learning_runs)")
    parser.add_argument("--eval-batch", type=int, default=105, help="evaluator batch size")
    parser.add_argument("--trl-lr", type=float, default=LR,
                        help="TRL's learning rate (default 3e-5, the comparison's fixed setting; "
                             "ours takes the quickstart config's)")
    parser.add_argument("--ours-lr", type=float, default=None,
                        help="our contenders' learning rate (default: their quickstart config's)")
    parser.add_argument("--ours-env-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="an env arg for our contenders (repeatable), e.g. "
                             "env.zero_variance_keep=0.5")
    parser.add_argument("--trl-worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error(f"--minutes must be > 0, got {args.minutes}")
    if args.trl_worker is not None:
        trl_worker(args.trl_worker, args.minutes, args.trl_lr)
        return 0
    bad = [a for a in args.ours_env_arg if "=" not in a]
    if bad:
        parser.error(f"--ours-env-arg takes KEY=VALUE, got {bad}")
    env_args = dict(a.split("=", 1) for a in args.ours_env_arg)
    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown or not names:
        parser.error(f"unknown contenders {unknown}; choose from {', '.join(CONTENDERS)}")
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    from atroposlib.inference.bundled import is_prepared, prepare_bundled_model

    if not is_prepared():
        prepare_bundled_model()
    work = args.work_dir or args.json_out.parent / "bench_learning_runs"
    work.mkdir(parents=True, exist_ok=True)
    plot_out = args.plot_out or args.json_out.with_suffix(".png")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    results: dict[str, dict[str, Any]] = {}
    try:
        for name in names:
            print(f"[bench] {name}: training for {args.minutes:g} min", flush=True)
            begin = time.monotonic()
            result = (run_trl(args.minutes, work, args.trl_lr) if name == "trl"
                      else run_ours(name, args.minutes, work, args.ours_lr, env_args))
            result["budget_minutes"] = args.minutes
            results[name] = result
            print(f"[bench] {name}: {result['steps']} steps, {result['sequences']} sequences in "
                  f"{result['train_seconds']:.0f}s of training ({time.monotonic() - begin:.0f}s "
                  "with start-up)", flush=True)
    except KeyboardInterrupt:
        print("[bench] interrupted: stopping the running contender", flush=True)
        return 130
    finally:
        for tree in list(LIVE):
            tree.stop()
    evaluate_all(results, args.eval_batch)
    report(results, args.json_out, plot_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
