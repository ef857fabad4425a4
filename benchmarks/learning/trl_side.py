"""The TRL contender: ``GRPOTrainer`` on the same task in a child process, with its own best knobs.

A :class:`TrlSetting` is one point of TRL's small sweep (learning rate, bf16 on/off, token- or
sequence-level importance sampling); ``trl`` runs one setting, ``--trl-sweep`` runs them all.
``lora=R`` trains LoRA adapters instead of the top layers whole, placed as our quickstart places
them, so the two LoRA loops compare like for like.
"""

from __future__ import annotations

import itertools
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.learning.ours import POINTS, STARTUP_ALLOWANCE, lora_placement, task_shape
from benchmarks.process_tree import Tree

_SHAPE = task_shape()  # the quickstart config's: ours trains with the same values
GROUP_SIZE, MAX_TOKENS = _SHAPE["group_size"], _SHAPE["max_tokens"]
BATCH_SIZE, TRAIN_LAYERS = _SHAPE["batch_size"], _SHAPE["trainable_layers"]


@dataclass(frozen=True)
class TrlSetting:
    """TRL's knobs the sweep varies (everything else is the task's, fixed).

    Attributes:
        lr: ``learning_rate``.
        bf16: ``bf16`` (autocast on CPU: about 2x the steps of fp32 here).
        level: ``importance_sampling_level``: ``token`` (GRPO) or ``sequence`` (GSPO's
            length-normalised sequence ratio).
        lora_r: 0: the top layers train whole (as ``ours-<loss>``); R > 0: peft LoRA adapters
            of rank R on the same modules and layers as the quickstart's
            (:func:`~benchmarks.learning.ours.lora_placement`: its target modules, ``lora_alpha`` scaled to R, the top
            layers), as ``ours-<loss>-lora``.
    """

    lr: float = 3e-5
    bf16: bool = False
    level: str = "token"
    lora_r: int = 0

    @property
    def name(self) -> str:
        """``trl-lr3e-05-bf16-sequence`` style (``-lora16`` appended for LoRA): the run directory and the table's label."""
        lora = f"-lora{self.lora_r}" if self.lora_r else ""
        return f"trl-lr{self.lr:g}-{'bf16' if self.bf16 else 'fp32'}-{self.level}{lora}"

    def record(self) -> dict[str, Any]:
        """The setting as a result file keeps it (``lora_r`` only when LoRA, so files written
        before LoRA existed still match their settings)."""
        record = asdict(self)
        if not self.lora_r:
            del record["lora_r"]
        return record

    @classmethod
    def parse(cls, text: str) -> TrlSetting:
        """``lr=6e-5,bf16=1,level=sequence,lora=16`` (any subset; the rest default).

        Raises:
            ValueError: an unknown key or a bad value (the message names it).
        """
        values: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, value = part.partition("=")
            if key == "lr":
                values["lr"] = float(value)
            elif key == "bf16":
                values["bf16"] = value.lower() in ("1", "true", "on", "yes")
            elif key == "level" and value in ("token", "sequence"):
                values["level"] = value
            elif key == "lora" and value.isdigit():
                values["lora_r"] = int(value)
            else:
                raise ValueError(f"bad TRL setting {part!r}: use lr=FLOAT, bf16=0|1, "
                                 "level=token|sequence, lora=RANK (0: no LoRA)")
        return cls(**values)


#: the sweep: TRL's default lr and ours, fp32 and bf16, token and sequence level
SWEEP = tuple(TrlSetting(lr, bf16, level) for lr, bf16, level in itertools.product(
    (3e-5, 6e-5), (False, True), ("token", "sequence")))


def best_setting(sweep_json: Path) -> TrlSetting:
    """The setting a sweep JSON (written by ``--trl-sweep``) names as TRL's best.

    Raises:
        ValueError: the file has no ``trl_sweep.best``.
    """
    payload = json.loads(sweep_json.read_text())
    best = (payload.get("trl_sweep") or {}).get("best")
    if not best:
        raise ValueError(f"{sweep_json} has no trl_sweep.best; run bench_learning.py --trl-sweep first")
    return TrlSetting(**best["setting"])


def run_trl(setting: TrlSetting, minutes: float, out: Path, difficulty: int,
            run_name: str | None = None) -> dict[str, Any]:
    """Run the TRL contender in a child process (``--trl-worker``).

    Returns:
        As :func:`benchmarks.learning.ours.run_ours` (no ``groups``), plus ``trl_setting``.

    Raises:
        RuntimeError: the worker failed (message names its log).
    """
    run_dir = out / (run_name or setting.name)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    budget = 60.0 * minutes
    argv = [sys.executable, "-m", "benchmarks.bench_learning", "--trl-worker", str(run_dir),
            "--minutes", str(minutes), "--task-difficulty", str(difficulty),
            "--trl-setting",
            f"lr={setting.lr},bf16={int(setting.bf16)},level={setting.level},lora={setting.lora_r}"]
    with Tree(argv, run_dir / "bench.log") as tree:
        code = tree.wait(budget + STARTUP_ALLOWANCE)
    if code != 0:
        raise RuntimeError(f"trl: the worker exited with {code}; see {run_dir}/bench.log")
    result = json.loads((run_dir / "result.json").read_text())
    points = {float(k): v for k, v in result["points"].items()}
    return {"points": points, "steps": result["steps"], "sequences": result["sequences"],
            "train_seconds": result["train_seconds"], "peak_rss_bytes": tree.peak_rss,
            "peak_rss_by_part": dict(tree.peak_rss_by_part), "peak_pss_bytes": tree.peak_pss,
            "rss_by_part_at_peak": dict(tree.rss_by_part_at_peak), "other_cmdlines": dict(tree.other_cmdlines),
            "lr": setting.lr,
            "trl_setting": setting.record()}


def trl_worker(run_dir: Path, minutes: float, difficulty: int, setting: TrlSetting) -> None:
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
    from example_trainer.lora import apply_lora

    env_cfg = ArithmeticEnvConfig(difficulty=difficulty)
    model_dir = str(bundled_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager")
    if setting.lora_r:
        model = apply_lora(model, **lora_placement(setting.lora_r))
    else:
        freeze_all_but_last_layers(model, TRAIN_LAYERS)
    eos_ids = eos_token_ids(model, tokenizer)
    rng = random.Random(env_cfg.seed)  # the env's training split, drawn like the env draws it
    problems = [make_problem(rng, difficulty, False, env_cfg.heldout_fraction) for _ in range(20_000)]
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
            if setting.lora_r:  # peft's adapter folder, holding ``state`` (the evaluator merges it)
                path = points_dir / f"{frac:.2f}"
                now = {n: p.detach().clone() for n, p in trainable}
                with torch.no_grad():
                    for n, p in trainable:
                        p.copy_(state[n])
                    model.save_pretrained(str(path))
                    for n, p in trainable:
                        p.copy_(now[n])
            else:
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
        num_generations=GROUP_SIZE, max_completion_length=MAX_TOKENS, learning_rate=setting.lr,
        loss_type="grpo", importance_sampling_level=setting.level, bf16=setting.bf16,
        beta=0.0, epsilon=0.2, temperature=1.0, use_cpu=True,
        max_steps=100_000, save_strategy="no", report_to="none", logging_steps=1,
        dataloader_num_workers=0, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=arithmetic_reward, args=config,
                          train_dataset=dataset, processing_class=tokenizer, callbacks=[clock])
    trainer.train()
    clock.finish()
    (run_dir / "result.json").write_text(json.dumps({
        "points": {str(k): v for k, v in clock.saved.items()}, "steps": clock.steps,
        "sequences": clock.steps * BATCH_SIZE, "train_seconds": clock.seconds}))


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
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

