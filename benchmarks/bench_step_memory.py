"""Where a trainer step's memory goes: the real ``StepRunner`` on quickstart-shaped batches, per setting.

The trainer rests between steps (its heap given back with ``release_free_heap``) and rises
inside each step; that rise is most of the quickstart loop's peak above TRL's. This bench loads
the policy as ``atropos-grpo`` does from a launch config's ``trainer:`` section, then takes
steps on synthetic batches shaped like the arithmetic env's (groups sharing one prompt, short
completions), each setting in turn (step 1 is setting 1, step 2 setting 2, ...), so every
setting meets the same machine state. For each setting it prints the median seconds per step
and the median rise of the process's resident set (RSS, sampled every millisecond) over its
resting RSS before the step, and ratios against the first setting (the baseline, measured in
the same run)::

    python benchmarks/bench_step_memory.py --settings "micro_batch_size=8;micro_batch_size=4" --steps 10
    python benchmarks/bench_step_memory.py --settings "micro_batch_size=8" --profile

``--settings``: semicolon-separated settings, each a comma-separated list of trainer keys
(``key=value``, YAML values) over the config's; only keys a step reads (``micro_batch_size``,
``pad_multiple``, ``loss_type`` ...) and ``gradient_checkpointing`` /
``gradient_checkpointing_mode`` (switched on the shared policy before each of its steps) can
differ, since every setting shares the loaded policy.
``--profile`` also runs one step per setting under torch's profiler and splits the live
tensor memory at the step's peak into torch's categories (parameters, optimizer state,
gradients, activations, temporaries ...): the part of the RSS rise that is not there is
malloc keeping freed memory inside the step.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from atroposlib.utils.heap import resident_bytes

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks.results, when run as a script
    sys.path.insert(0, str(ROOT))
#: trainer keys that start or talk to other parts (vLLM, evaluations, the time budget): a bench
#: step needs none of them
NOT_FOR_A_STEP = ("weight_sync", "vllm", "eval", "batch_timeout", "training_steps", "max_train",
                  "checkpoint")
#: torch.profiler's memory categories, in the order of its exported timeline's columns 1..8
CATEGORIES = ("parameter", "optimizer_state", "input", "temporary", "activation", "gradient",
              "autograd_detail", "unknown")


def parse_settings(text: str) -> list[dict[str, Any]]:
    """``"a=1,b=x;a=2"`` -> ``[{"a": 1, "b": "x"}, {"a": 2}]`` (values read as YAML).

    Raises:
        ValueError: a part is not ``key=value``.
    """
    settings = []
    for part in text.split(";"):
        setting: dict[str, Any] = {}
        for item in filter(None, (p.strip() for p in part.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ValueError(f"setting {item!r} is not key=value (e.g. micro_batch_size=4)")
            setting[key.strip()] = yaml.safe_load(value)
        settings.append(setting)
    return settings


def synthetic_group(rnd: random.Random, group_size: int, prompt_len: int, max_completion: int,
                    vocab: int) -> dict[str, Any]:
    """One scored group as ``GET /batch`` returns it: one prompt, completions of 4..max tokens."""
    prompt = [rnd.randrange(5, vocab) for _ in range(prompt_len)]
    tokens, masks, logprobs = [], [], []
    for _ in range(group_size):
        completion = [rnd.randrange(5, vocab) for _ in range(rnd.randint(4, max_completion))]
        tokens.append(prompt + completion)
        masks.append([-100] * prompt_len + completion)
        logprobs.append([1.0] * prompt_len + [-0.7] * len(completion))
    return {"tokens": tokens, "masks": masks, "inference_logprobs": logprobs,
            "scores": [float(rnd.random() < 0.5) for _ in range(group_size)],
            "generation_params": {"temperature": 1.0}}


class RssPeak:
    """This process's peak RSS (bytes) since the last :meth:`reset`, sampled every millisecond."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def reset(self) -> int:
        self.peak = resident_bytes()
        return self.peak

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, resident_bytes())
            time.sleep(0.001)

    def close(self) -> None:
        self._stop.set()


def live_memory_at_peak(step) -> dict[str, float]:
    """Run ``step()`` under torch's profiler; MiB of live tensors per category at the step's peak.

    Returns:
        ``{category: MiB at the peak, "total", "total_before_step", "max": {category: its own
        largest MiB during the step}}``, categories as :data:`CATEGORIES`.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "timeline.json"
        prof.export_memory_timeline(str(path), device="cpu")
        _times, sizes = json.loads(path.read_text())
    at_peak = max(sizes, key=sum)
    out = {name: at_peak[i + 1] / 2**20 for i, name in enumerate(CATEGORIES)}
    out["total"] = sum(at_peak) / 2**20
    out["total_before_step"] = sum(sizes[0]) / 2**20
    # each category's own largest size during the step (not necessarily at the same moment)
    out["max"] = {name: max(row[i + 1] for row in sizes) / 2**20 for i, name in enumerate(CATEGORIES)}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "quickstart-cpu.yaml",
                        help="launch config whose trainer: section builds the policy")
    parser.add_argument("--settings", default="micro_batch_size=8;micro_batch_size=4",
                        help="semicolon-separated settings; the first is the baseline")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per setting")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per setting first")
    parser.add_argument("--groups", type=int, default=2, help="groups per batch")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=46, help="prompt tokens (the quickstart's chat prompt)")
    parser.add_argument("--max-completion", type=int, default=24, help="longest completion (env.max_tokens)")
    parser.add_argument("--profile", action="store_true",
                        help="also split one step's live tensors at its peak by torch's categories")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="result file (default: benchmarks/results/bench_step_memory_<date>.json)")
    args = parser.parse_args(argv)

    import torch

    from atroposlib.utils.heap import release_free_heap
    from example_trainer import distributed
    from example_trainer.checkpointing import enable_checkpointing
    from example_trainer.config import TrainerConfig
    from example_trainer.policy import load_training_policy
    from example_trainer.step import StepRunner

    trainer = yaml.safe_load(args.config.read_text()).get("trainer", {})
    base = {k: v for k, v in trainer.items() if not k.startswith(NOT_FOR_A_STEP)}
    settings = parse_settings(args.settings)
    configs = [TrainerConfig(**{**base, **s}, weight_sync="none") for s in settings]
    device = torch.device("cpu")
    dist = distributed.setup(configs[0], device)
    policy = load_training_policy(configs[0], dist, None, device)
    runners = [StepRunner(c, dist, policy, device) for c in configs]
    vocab = min(len(policy.tokenizer), policy.model.get_input_embeddings().num_embeddings)
    rnd = random.Random(0)
    rss = RssPeak()
    rows: list[dict[str, Any]] = [{"setting": s, "seconds": [], "rss_rise_mib": []} for s in settings]

    def batch() -> list[dict[str, Any]]:
        return [synthetic_group(rnd, args.group_size, args.prompt_len, args.max_completion, vocab)
                for _ in range(args.groups)]

    def checkpointing(config: TrainerConfig) -> None:
        """Switch the shared policy's activation checkpointing to ``config``'s."""
        if config.gradient_checkpointing:
            enable_checkpointing(policy.model, config.gradient_checkpointing_mode)
        else:
            policy.model.gradient_checkpointing_disable()

    step = 0
    for round_ in range(args.warmup + args.steps):
        for runner, row in zip(runners, rows, strict=True):
            step += 1
            groups = batch()
            checkpointing(runner.config)
            release_free_heap()  # as the trainer does after each step: every step starts at rest
            resting = rss.reset()
            begin = time.perf_counter()
            runner.run(step, groups)
            seconds = time.perf_counter() - begin
            if round_ >= args.warmup:
                row["seconds"].append(seconds)
                row["rss_rise_mib"].append((rss.peak - resting) / 2**20)
                row["resting_rss_mib"] = resting / 2**20
    if args.profile:
        for runner, row in zip(runners, rows, strict=True):
            step += 1
            groups = batch()
            checkpointing(runner.config)
            release_free_heap()
            row["live_at_peak_mib"] = live_memory_at_peak(lambda r=runner, g=groups, k=step: r.run(k, g))
    rss.close()

    first = rows[0]
    base_s, base_rise = statistics.median(first["seconds"]), statistics.median(first["rss_rise_mib"])
    print(f"{len(rows)} settings x {args.steps} steps, {args.groups} groups of {args.group_size}, "
          f"{args.prompt_len}-token prompts; resting RSS {first['resting_rss_mib']:.0f} MiB")
    for row in rows:
        row["median_seconds"] = statistics.median(row["seconds"])
        row["median_rss_rise_mib"] = statistics.median(row["rss_rise_mib"])
        row["seconds_ratio"] = row["median_seconds"] / base_s
        row["rss_rise_ratio"] = row["median_rss_rise_mib"] / base_rise if base_rise else float("nan")
        print(f"  {row['setting']}: {row['median_seconds']:.2f} s/step ({row['seconds_ratio']:.2f}x), "
              f"RSS rise {row['median_rss_rise_mib']:.0f} MiB ({row['rss_rise_ratio']:.2f}x)")
        live = row.get("live_at_peak_mib")
        if live:
            parts = ", ".join(f"{k} {v:.0f}" for k, v in live.items() if k not in ("total_before_step", "max") and v >= 1)
            print(f"    live tensors at the step's peak (MiB): {parts}; before the step {live['total_before_step']:.0f}")
    result = {"config": str(args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config),
              "groups": args.groups, "group_size": args.group_size, "prompt_len": args.prompt_len,
              "max_completion": args.max_completion, "torch": torch.__version__, "rows": rows}
    from benchmarks.results import command_argv, default_result_path, write_result

    write_result(args.json_out or default_result_path("bench_step_memory"), "bench_step_memory", result,
                 seeds={"batches": "fixed token ids, no sampling"}, argv=command_argv(__file__, argv))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
