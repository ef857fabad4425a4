"""GRPO example trainer: register with run-api, then per step pull ONE batch, train, sync vLLM.

Meant to be read top to bottom and copied (nanoGPT style). The loop::

    register -> eval (before) -> for step: GET /batch -> GRPO loss -> optimizer step
             -> sync vLLM (reload / restart) -> [checkpoint] -> [eval] -> final eval, summary

Loss: GRPO (Shao et al. 2024, arXiv:2402.03300) with the PPO clipped ratio per token against
the sampler's log-probs, pessimistic for every advantage sign, optional k3 KL; or Dr. GRPO, DAPO,
GSPO, CISPO (``--loss-type``), optionally with truncated/masked importance sampling against the
sampler's log-probs (``--is-correction``) (``example_trainer/loss.py``). Batches: ``example_trainer/data.py``.

Launch everything with one command (run-api, vLLM, the arithmetic env, this trainer)::

    atropos-launch configs/quickstart-cpu.yaml

Or by hand, in four terminals::

    run-api --host 127.0.0.1 --port 8000
    atropos-grpo --training-steps 20 --batch-size 32 --lr 2e-5 --vllm-port 9001 \
        --eval-command "python environments/arithmetic_server.py evaluate \
            --openai.base_url {base_url} --env.data_dir_to_save_evals {out_dir}"
    python environments/arithmetic_server.py serve --openai.base_url http://127.0.0.1:9001/v1 \
        --env.rollout_server_url http://127.0.0.1:8000

The trainer launches its own vLLM (``--vllm-port``) unless ``--vllm-url`` names one; the
environments retry until it is up. Every run writes ``runs/<timestamp>/`` (or ``--run-dir``):
``checkpoints/``, ``metrics.jsonl``, ``plot.png``, ``summary.json``, ``logs/``.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from pathlib import Path
from typing import Any

from atroposlib.api.models import IGNORE_INDEX
from example_trainer.config import TrainerConfig


def main(argv: list[str] | None = None) -> int:
    """Console script ``atropos-grpo``: parse flags (``--help`` lists them) and train.

    Returns:
        :func:`exit_code` of the run's summary (0 when every step or the time budget ran, 130
        after Ctrl-C, 143 after SIGTERM, 1 otherwise); 2 for a bad flag, layout, ``--resume``
        directory or pre-flight check (one line each on stderr, no traceback).
    """
    from pydantic import ValidationError
    from pydantic_settings import CliApp, CliSettingsSource

    from atroposlib.errors import ConfigError
    from atroposlib.utils.cli import ArgumentParser, validation_error_message

    source = CliSettingsSource(TrainerConfig, root_parser=ArgumentParser(prog="atropos-grpo"))
    try:
        config = CliApp.run(TrainerConfig, cli_args=sys.argv[1:] if argv is None else argv,
                            cli_settings_source=source)
    except ValidationError as exc:
        print(f"atropos-grpo: {validation_error_message(exc, None, 'flags', kebab=True)}",
              file=sys.stderr)
        return 2
    try:
        summary = train(config)
    except ConfigError as exc:  # pre-flight, batch layout, --fsdp, --resume: the message is the fix
        print(f"atropos-grpo: {exc}", file=sys.stderr)
        return 2
    return exit_code(summary, config.training_steps)


def exit_code(summary: dict[str, Any], training_steps: int) -> int:
    """The trainer's exit status for a run's summary (the dict :func:`train` returns).

    0 when at least one step ran and every step (or the ``--max-train-seconds`` budget) did;
    otherwise ``128 + N`` when a signal N asked the run to stop (130 for Ctrl-C, 143 for
    SIGTERM: what a shell reports for a process that signal ended, and what ``atropos-launch``
    and the env CLI exit with on Ctrl-C); otherwise 1.
    """
    finished = summary.get("steps") == training_steps or summary.get("stopped_by_time_budget")
    if finished and summary.get("steps"):
        return 0
    signum = summary.get("stop_signal")
    return 128 + int(signum) if summary.get("stopped") == "stop_requested" and signum else 1


def train(config: TrainerConfig) -> dict[str, Any]:
    """Run GRPO training as configured; return the summary (also written to summary.json).

    ``summary.json`` is written however the run ends, also when an exception (or a second
    Ctrl-C) ends it: ``stopped`` says how (``completed``, ``time_budget``, ``stop_requested``
    for a first SIGINT/SIGTERM, ``interrupted`` for KeyboardInterrupt, ``error`` for any other
    exception, named in ``error``), ``train_loop_seconds`` runs from registration to the end of
    the loop or the interruption, ``final_checkpoint`` is null unless ``checkpoints/final`` was
    written by this run, and ``last_checkpoint`` names the newest checkpoint this run wrote
    (null: none).

    Raises:
        ApiError: run-api unreachable or refusing the registration.
        InferenceError: vLLM did not start or refused a weight update.
        TimeoutError: no batch arrived within ``batch_timeout`` seconds.
    """
    import torch

    from atroposlib.api.client import AtroposClient
    from atroposlib.api.models import Registration
    from example_trainer import checkpoint as ckpt_io
    from example_trainer import distributed, lora
    from example_trainer.data import batch_to_sequences, make_micro_batches
    from example_trainer.loss import grpo_loss, objective_options, token_logprobs
    from example_trainer.report import NullRunLog, RunLog, run_eval_command, write_summary
    from example_trainer.vllm_sync import VLLMSync, save_weights

    wall_start = time.perf_counter()
    device = torch.device("cuda" if config.device == "cuda" or (
        config.device == "auto" and torch.cuda.is_available()) else "cpu")
    # under torchrun: check the batch layout, join the process group (rank 0 talks to the API)
    dist = distributed.setup(config, device)
    device = dist.device
    # checked before anything heavy loads: a bad --resume fails in a second, with the fix
    resume = ckpt_io.require_checkpoint(config.resume, config.lora_r > 0) if config.resume else None
    # every rank (cheap probes), so none waits on a rank that failed; before the model loads
    # and vLLM starts, so a wrong URL or path fails in seconds
    _preflight(config)
    # ------------------------------------------------------------------ run directory
    run_dir = Path(dist.from_main(config.run_dir or config.resume
                                  or str(Path("runs") / time.strftime("%Y%m%d-%H%M%S", time.gmtime()))))
    if dist.is_main:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / "trainer_config.json").write_text(config.model_dump_json(indent=2))
        print(f"[grpo] run directory: {run_dir}", flush=True)

    # ------------------------------------------------------------------ model and optimizer
    torch.manual_seed(config.seed)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(
        config.dtype, torch.bfloat16 if device.type == "cuda" else torch.float32)
    # sharded: every rank loads on the CPU and FSDP moves its own shard to the device
    load_device = torch.device("cpu") if dist.enabled else device
    model, tokenizer = load_policy(config.model, load_device, dtype, config.attn_implementation)
    if config.lora_r:
        model = lora.apply_lora(model, r=config.lora_r, alpha=config.lora_alpha,
                                dropout=config.lora_dropout, target_modules=config.lora_target_modules,
                                last_layers=config.train_last_layers)
    elif config.train_last_layers:
        freeze_all_but_last_layers(model, config.train_last_layers)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        if config.lora_r:  # frozen embeddings: inputs must carry grad for checkpointed blocks
            model.enable_input_require_grads()
    if config.mixed_precision == "bf16" and not config.lora_r and not dist.enabled:
        from example_trainer.memory import compact_frozen_linears

        compact_frozen_linears(model, torch.bfloat16)  # frozen Linears in bf16: exact under autocast
    if resume is not None and resume.lora:  # before sharding: FSDP shards the loaded adapter
        lora.load_adapter(model, resume.adapter_dir)
    model = dist.shard(model)
    if resume is not None and not resume.lora:
        ckpt_io.load_full_weights(model, resume)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    if dist.is_main:
        print(f"[grpo] training {_numel(trainable) / 1e6:.1f}M of {_numel(model.parameters()) / 1e6:.1f}M "
              f"parameters on {device}" + (f" x {dist.world_size} ranks (FSDP)" if dist.enabled else ""),
              flush=True)
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, betas=config.adam_betas,
                                  weight_decay=config.weight_decay)
    start_step = 0
    if resume is not None:
        start_step = ckpt_io.load_training_state(model, optimizer, resume)
        if dist.is_main:
            print(f"[grpo] resuming from {resume.path} after step {start_step}", flush=True)

    def save_checkpoint(name: str) -> None:
        nonlocal last_checkpoint

        def write_weights(out: Path) -> None:
            if lora.is_lora(model):
                lora.save_adapter(model, out / "adapter", full)
                if name != "final":  # a full model only where something must load one
                    return
            hf_model, weights = lora.export(model, full)  # LoRA: the adapter merged in
            save_weights(hf_model, tokenizer, out, True, state_dict=weights)

        full = dist.full_state_dict(model)  # sharded: every rank gathers, rank 0 writes
        ckpt_io.save_checkpoint(run_dir / "checkpoints" / name, step=steps_done, model=model,
                                optimizer=optimizer, write_weights=write_weights,
                                lora=lora.is_lora(model), is_main=dist.is_main)
        last_checkpoint = run_dir / "checkpoints" / name

    def sync_vllm() -> dict[str, float]:
        # every rank takes part in gathering the weights; rank 0 writes and reloads them
        full = dist.full_state_dict(model)
        metrics = vllm.sync(model, tokenizer, state_dict=full,
                            background=config.weight_sync_overlap) if dist.is_main else {}
        dist.wait_for_main()
        return metrics
    reference = None  # frozen starting policy for the KL term, loaded on first need
    keep_logits = accepts_logits_to_keep(model)
    # one prompt forward per group: needs logits_to_keep and a KV cache, and equal forwards on
    # every rank (FSDP collectives), so not sharded or with gradient checkpointing
    share_prefix = (config.shared_prefix and keep_logits and not dist.enabled
                    and not config.gradient_checkpointing)
    if config.shared_prefix and not share_prefix and dist.is_main:
        print("[grpo] shared_prefix: off (FSDP or gradient checkpointing): every rollout runs "
              "its whole prompt", flush=True)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.mixed_precision == "bf16")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    # ------------------------------------------------------------------ vLLM + bookkeeping
    vllm = VLLMSync(config, run_dir)
    if resume is not None and dist.is_main:
        past = ckpt_io.read_history(run_dir, start_step)
        ckpt_io.append_resume_marker(run_dir, start_step)
    runlog = RunLog(run_dir, config.use_wandb, config.wandb_project, config.wandb_group,
                    config.model_dump(mode="json"), plot_every=config.plot_every,
                    tensorboard_dir=Path(config.tensorboard_dir or run_dir / "tensorboard")
                    if config.tensorboard or config.tensorboard_dir else None
                    ) if dist.is_main else NullRunLog()
    if resume is not None and dist.is_main:
        runlog.history = [r for r in past if "loss" in r]
        runlog.evals = [(r["step"], r["eval/accuracy"]) for r in past if "eval/accuracy" in r]
    stop = _install_stop_handler()
    steps_done = start_step
    eval_before = eval_after = math.nan
    train_start: float | None = None  # set at registration
    train_seconds: float | None = None  # set when the loop ends (or, in `finally`, when interrupted)
    last_checkpoint: Path | None = None  # newest checkpoint this run wrote
    eval_seconds = 0.0  # periodic evaluations: not charged to --max-train-seconds
    out_of_time = False
    stopped = "completed"  # how the loop ended; an exception overrides it in `finally`
    failure: BaseException | None = None
    try:
        if dist.is_main:
            print(f"[grpo] starting vLLM ({config.weight_sync} sync)...", flush=True)
            vllm_seconds = vllm.start()
            print(f"[grpo] vLLM ready at {vllm.base_url} after {vllm_seconds:.1f}s", flush=True)
        if resume is not None or config.weight_sync == "lora":
            sync_vllm()  # serve the resumed policy (or the first adapter)

        def evaluate(step: int) -> float:
            nonlocal eval_seconds
            if not config.eval_command or not dist.is_main:
                return math.nan
            begin = time.perf_counter()
            vllm.wait()  # a background sync in flight: evaluate the newest weights
            metrics = run_eval_command(
                config.eval_command, base_url=vllm.base_url, model_name=vllm.model_name,
                out_dir=run_dir / "evals" / f"step_{step}", step=step, metric=config.eval_metric,
                timeout=config.eval_timeout, log_path=run_dir / "logs" / "eval.log")
            runlog.log_eval(step, metrics, config.eval_metric)
            eval_seconds += time.perf_counter() - begin  # outside the training budget
            return metrics[config.eval_metric]

        if resume is None:
            eval_before = evaluate(0)
        else:  # the policy before training was evaluated by the first run
            eval_before = next((a for s, a in runlog.evals if s == 0), math.nan)

        # -------------------------------------------------------------- register with run-api
        client = AtroposClient(config.api_url, api_key=config.api_key) if dist.is_main else None
        if client is not None:
            client.register(Registration(
                wandb_group=config.wandb_group or "", wandb_project=config.wandb_project or "",
                batch_size=config.batch_size, max_token_len=config.max_token_len,
                checkpoint_dir=str(run_dir / "checkpoints"),
                save_checkpoint_interval=config.checkpoint_interval or config.training_steps,
                starting_step=start_step, num_steps=config.training_steps,
                max_staleness=config.max_staleness))
            print(f"[grpo] registered with {config.api_url}: batch_size={config.batch_size}", flush=True)

        train_start = time.perf_counter()
        last_step_total = 0.0
        for step in range(start_step + 1, config.training_steps + 1):
            if dist.from_main(stop.requested):  # rank 0 decides for every rank
                print("[grpo] stop requested: finishing early", flush=True)
                stopped = "stop_requested"
                break
            # stop when the next step (assumed as long as the last one) would overrun the budget;
            # evaluations do not count: the budget is for training, however often one evaluates
            elapsed = time.perf_counter() - train_start - eval_seconds
            if dist.from_main(bool(config.max_train_seconds)
                              and elapsed + last_step_total > config.max_train_seconds):
                print(f"[grpo] time budget of {config.max_train_seconds:.0f}s used after "
                      f"{steps_done} steps: finishing", flush=True)
                out_of_time = True
                stopped = "time_budget"
                break
            # ---------------------------------------------------------- 1. one batch
            wait_start = time.perf_counter()
            batch = _shared_batch(dist, client, config.batch_timeout, stop)
            if batch is None:  # a stop was requested while waiting
                stopped = "stop_requested"
                break
            wait_s = time.perf_counter() - wait_start
            step_start = time.perf_counter()
            sequences, stats = batch_to_sequences(batch, config.max_token_len,
                                                  config.scale_advantages)
            micro_batches = make_micro_batches(sequences, config.micro_batch_size, pad_id,
                                               config.pad_multiple, by_prefix=share_prefix)
            step_tokens = sum(int((mb.labels != IGNORE_INDEX).sum()) for mb in micro_batches)

            # ---------------------------------------------------------- 2. loss and backward
            if config.kl_coef > 0 and reference is None and any(
                    _needs_reference(mb) for mb in micro_batches):
                reference, _ = load_policy(config.model, load_device, dtype, config.attn_implementation)
                reference = dist.shard(reference.requires_grad_(False)).eval()
            # step-wide normalisers (sequence or token counts) come from `sequences`/`stats` or
            # the whole list above; from here on each rank keeps only its share of micro-batches
            micro_batches = dist.my_share(micro_batches)  # all of them in a single process
            sums: dict[str, float] = {}
            for mb in micro_batches:
                # the LM head runs only where completions are: prompt positions carry no loss
                keep, mb = mb.to(device).trained_tail() if keep_logits else (0, mb.to(device))
                logits = policy_logits(model, mb, keep, autocast, share_prefix)
                ref_lp = mb.ref_logprobs
                # rows the env sent none for; sharded, every rank runs the (collective) forward
                if config.kl_coef > 0 and reference is not None and (dist.enabled or _needs_reference(mb)):
                    with torch.no_grad():
                        ref_logits = policy_logits(reference, mb, keep, autocast, share_prefix)
                        model_ref = token_logprobs(ref_logits, mb.labels, mb.temperatures)
                    ref_lp = model_ref if ref_lp is None else torch.where(
                        torch.isnan(ref_lp), model_ref, ref_lp)
                out = grpo_loss(logits, mb.labels, mb.advantages, mb.old_logprobs,
                                num_sequences=stats.num_sequences, num_tokens=step_tokens,
                                temperature=mb.temperatures, ref_logprobs=ref_lp,
                                kl_coef=config.kl_coef, distill_token_ids=mb.distill_token_ids,
                                distill_logprobs=mb.distill_logprobs,
                                distill_coef=config.distill_coef, **objective_options(config))
                (out.loss * dist.grad_scale).backward()  # x N: FSDP averages over the N ranks
                for key, value in out.metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
                sums["loss"] = sums.get("loss", 0.0) + out.loss.item()
                sums["attended_tokens"] = sums.get("attended_tokens", 0.0) + float(mb.attention_mask.sum())
            sums = dist.sum_metrics(sums)  # over ranks: each rank saw its share of the batch

            # ---------------------------------------------------------- 3. optimizer step
            lr = config.lr * min(1.0, step / config.warmup_steps) if config.warmup_steps else config.lr
            for group in optimizer.param_groups:
                group["lr"] = lr
            grad_norm = dist.scalar(torch.nn.utils.clip_grad_norm_(trainable, config.max_grad_norm))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            compute_s = time.perf_counter() - step_start

            # ---------------------------------------------------------- 4. sync vLLM
            sync_metrics: dict[str, float] = {}
            if step % config.weight_sync_interval == 0 or step == config.training_steps:
                sync_metrics = sync_vllm()

            # ---------------------------------------------------------- 5. checkpoint
            steps_done = step
            if config.checkpoint_interval and step % config.checkpoint_interval == 0:
                save_checkpoint(f"step_{step}")

            # ---------------------------------------------------------- 6. log
            n = stats.num_sequences
            scores = stats.scores
            runlog.log(step, {
                "loss": sums["loss"], "pg_loss": sums["pg_loss"] / n, "kl": sums["kl"] / n,
                "ratio": sums["ratio"] / n, "clip_fraction": sums["clip_fraction"] / n,
                "logprob": sums["logprob"] / n, "grad_norm": grad_norm, "lr": lr,
                "reward/mean": sum(scores) / n, "reward/max": max(scores), "reward/min": min(scores),
                "advantage/mean": sum(stats.advantages) / n,
                "advantage/abs_mean": sum(abs(a) for a in stats.advantages) / n,
                "sampler_logprob_diff": sums["sampler_logprob_diff_sum"] / max(sums["sampler_tokens"], 1.0),
                "sampler_out_of_range": sums["sampler_out_of_range_tokens"] / max(sums["sampler_tokens"], 1.0),
                "is_corrected_fraction": sums["is_corrected_tokens"] / max(sums["sampler_tokens"], 1.0),
                "trained_tokens": sums["tokens"], "sequences": n, "groups": stats.num_groups,
                **({"distill_kl": sums["distill_kl_sum"] / sums["distill_tokens"]}
                   if sums["distill_tokens"] else {}),
                "max_len": stats.max_len,
                "tokens_per_second": sums["attended_tokens"] / compute_s,  # all ranks together
                "step_seconds": compute_s, "batch_wait_seconds": wait_s, **sync_metrics,
            })

            last_step_total = time.perf_counter() - wait_start

            # ---------------------------------------------------------- 7. periodic eval
            if config.eval_interval and step % config.eval_interval == 0 and step != config.training_steps:
                if step % config.weight_sync_interval != 0:
                    sync_vllm()
                evaluate(step)
        train_seconds = time.perf_counter() - train_start

        # -------------------------------------------------------------- final checkpoint + eval
        save_checkpoint("final")
        if steps_done and config.eval_command and not dist.from_main(stop.requested):
            if steps_done % config.weight_sync_interval and steps_done != config.training_steps:
                sync_vllm()
            eval_after = evaluate(steps_done)
    except BaseException as exc:
        failure = exc
        raise
    finally:
        stop.restore()  # the caller's SIGINT/SIGTERM handlers again
        if train_seconds is None:  # interrupted inside the loop (or before it began)
            train_seconds = 0.0 if train_start is None else time.perf_counter() - train_start
        if failure is not None:
            stopped = "interrupted" if isinstance(failure, KeyboardInterrupt) else "error"
        dist.close(failure)  # the other ranks wait here for rank 0's final eval
        if dist.is_main:
            vllm.stop()
            vllm.cleanup()  # the sync copy duplicates checkpoints/final
        wall = time.perf_counter() - wall_start
        if runlog.history:
            runlog.plot(run_dir / "plot.png")
        summary = write_summary(
            run_dir / "summary.json" if dist.is_main else None, steps=steps_done, training_steps=config.training_steps,
            wall_seconds=wall, train_loop_seconds=train_seconds,
            eval_accuracy_before=eval_before, eval_accuracy_after=eval_after,
            eval_accuracy_delta=eval_after - eval_before,
            evals=[{"step": s, "accuracy": a} for s, a in runlog.evals],
            final_checkpoint=str(last_checkpoint) if last_checkpoint and last_checkpoint.name == "final" else None,
            last_checkpoint=str(last_checkpoint) if last_checkpoint else None,
            stopped=stopped, error=f"{type(failure).__name__}: {failure}" if failure is not None else None,
            stop_signal=stop.signum if stopped == "stop_requested" else None,
            stopped_by_time_budget=out_of_time, eval_seconds=eval_seconds,
            weight_sync=config.weight_sync, batch_size=config.batch_size, lr=config.lr,
            mean_sync_update_seconds=_mean(h.get("sync/update_seconds") for h in runlog.history),
            mean_step_seconds=_mean(h.get("step_seconds") for h in runlog.history),
        )
        runlog.close()
        if dist.is_main:
            print(f"[grpo] summary: {summary}", flush=True)
    return summary


def load_policy(model_dir: str, device: Any, dtype: Any, attn_implementation: str | None) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer for training.

    Args:
        model_dir: HF model directory or hub id.
        device: torch device.
        dtype: torch dtype of the weights.
        attn_implementation: HF attention kernel; None = eager on CPU, sdpa on CUDA.

    Returns:
        ``(model, tokenizer)``.
    """
    from transformers import AutoModelForCausalLM

    from atroposlib.utils.hf_tokenizer import load_tokenizer

    attn = attn_implementation or ("sdpa" if device.type == "cuda" else "eager")
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn)
    return model.to(device), tokenizer


def policy_logits(model: Any, mb: Any, keep: int, autocast: Any, shared_prefix: bool = False) -> Any:
    """fp32 next-token logits of a micro-batch, as the loss consumes them.

    Args:
        model: the policy (or reference) causal LM.
        mb: a :class:`~example_trainer.data.MicroBatch` (``[B, T]`` inputs).
        keep: 0 for every position, else the last ``keep`` only (``logits_to_keep``; pass the
            micro-batch returned by :meth:`~example_trainer.data.MicroBatch.trained_tail`).
        autocast: a ``torch.autocast`` context (disabled for full precision).
        shared_prefix: run each prompt shared by several rows once
            (:func:`~example_trainer.shared_prefix.shared_prefix_logits`; the logits of
            untrained positions are then 0).

    Returns:
        ``[B, T or keep, V]`` float32 logits.
    """
    if shared_prefix:
        from example_trainer.shared_prefix import shared_prefix_logits

        return shared_prefix_logits(model, mb, keep, autocast)
    with autocast:
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                    **({"logits_to_keep": keep} if keep else {}))
    return out.logits.float()


def accepts_logits_to_keep(model: Any) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` (HF causal LMs since transformers 4.50).

    Looks through wrappers (peft's ``get_base_model``); FSDP2 keeps the module's own class.
    """
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(type(base).forward).parameters


def freeze_all_but_last_layers(model: Any, n: int) -> None:
    """Leave only the last ``n`` decoder layers and the final norm trainable.

    Works for HF decoder-only models that keep their blocks in ``model.model.layers`` (Llama,
    Qwen, Mistral, SmolLM ...). Embeddings (and a tied LM head) stay frozen.

    Raises:
        ValueError: the model has no ``model.layers`` list, or fewer than ``n`` layers.
    """
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or n > len(layers):
        raise ValueError(
            f"train_last_layers={n}: the model has {'no model.layers' if layers is None else len(layers)}"
            " decoder layers; lower it or leave it unset to train everything")
    model.requires_grad_(False)
    for layer in layers[len(layers) - n:]:
        layer.requires_grad_(True)
    norm = getattr(model.model, "norm", None)
    if norm is not None:
        norm.requires_grad_(True)


def wait_for_batch(client: Any, timeout: float, stop: Any) -> list[dict[str, Any]] | None:
    """Poll ``GET /batch`` until it returns a batch (one batch only: no draining).

    Args:
        client: an :class:`~atroposlib.api.client.AtroposClient`.
        timeout: seconds before giving up.
        stop: object whose ``requested`` turns True on SIGINT/SIGTERM.

    A ``/batch`` call that got no answer (run-api restarting, connection lost) is polled
    again until ``timeout``: the client then asks for the step it expected (``GET
    /batch?step=N``), so a batch the server served but whose reply was lost is not skipped.

    Returns:
        The batch (list of groups), or None when a stop was requested.

    Raises:
        TimeoutError: no batch within ``timeout`` seconds; the message says what to check.
        ApiUnavailableError: run-api still unreachable at the deadline.
    """
    from atroposlib.errors import ApiUnavailableError

    deadline = time.monotonic() + timeout
    # short polls: every second the trainer sleeps past a batch's arrival is a second it idles
    # (a 2 s backoff cap cost about 1 s per waiting step); an empty GET /batch is cheap
    delay = 0.05
    while not stop.requested:
        try:
            batch = client.get_batch()
        except ApiUnavailableError as exc:
            if time.monotonic() > deadline:
                raise
            print(f"[grpo] no answer from run-api ({exc}); asking again for the same step", flush=True)
            batch = None
        if batch:
            return batch
        if time.monotonic() > deadline:
            status = client.status()
            raise TimeoutError(
                f"no batch from the API within {timeout:.0f}s (queue: {status.get('queue_size')} "
                "groups). Are the environments running and pointed at this API and vLLM? Is "
                "batch_size a multiple of their group_size? Raise --batch-timeout if rollouts "
                "are just slow.")
        time.sleep(delay)
        delay = min(delay * 1.5, POLL_MAX_SECONDS)
    return None


#: longest pause between two ``GET /batch`` polls while waiting for a batch
POLL_MAX_SECONDS = 0.25


class _StopFlag:
    """Whether a stop was requested; :meth:`restore` puts back the signal handlers it replaced."""

    requested = False
    #: the signal that requested the stop (None: none did)
    signum: int | None = None

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}

    def restore(self) -> None:
        """Reinstall the SIGINT/SIGTERM handlers that were in place before (no-op if none)."""
        for sig, handler in self.previous.items():
            # None: the handler was not set from Python; the default is the closest
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self.previous.clear()


def _preflight(config: TrainerConfig) -> None:
    """Check run-api (``--api-url``), the model path and external ``--vllm-url`` servers in seconds.

    Raises:
        PreflightError: one line per problem, each with its fix.
    """
    from atroposlib.utils import preflight as pf

    # with weight_sync none the trainer never talks to vLLM, so its URL is not checked
    vllm_urls = [u.strip() for u in (config.vllm_url or "").split(",") if u.strip()]
    if config.weight_sync == "none":
        vllm_urls = []
    pf.raise_on_problems([
        pf.check_model_path(config.model, "--model"),
        pf.check_run_api(config.api_url, "--api-url"),
        *(pf.check_inference_server(url, None, "--vllm-url", "--served-model-name")
          for url in vllm_urls),
    ])


def _install_stop_handler() -> _StopFlag:
    """First SIGINT/SIGTERM: finish the current step, save, evaluate. Second: exit at once."""
    flag = _StopFlag()

    def handler(signum: int, frame: Any) -> None:
        if flag.requested:
            raise KeyboardInterrupt
        flag.requested, flag.signum = True, int(signum)
        print(f"[grpo] got signal {signum}: stopping after this step (again to abort)", flush=True)

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            flag.previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread (e.g. called from a test thread)
            pass
    return flag


def _shared_batch(dist: Any, client: Any, timeout: float, stop: Any) -> list[dict[str, Any]] | None:
    """Rank 0 pulls one batch with :func:`wait_for_batch`; every rank returns it (None: stop).

    Raises:
        TimeoutError, ApiError: on rank 0, as :func:`wait_for_batch`.
        RuntimeError: on the other ranks, when rank 0 got no batch (the message says why).
    """
    if not dist.enabled:
        return wait_for_batch(client, timeout, stop)
    try:
        batch = wait_for_batch(client, timeout, stop) if dist.is_main else None
    except Exception as exc:
        dist.from_main(f"rank 0 got no batch: {type(exc).__name__}: {exc}")
        raise
    shared = dist.from_main(batch)
    if isinstance(shared, str):
        raise RuntimeError(shared)
    return shared


def _numel(params: Any) -> int:
    return sum(p.numel() for p in params)


def _needs_reference(mb: Any) -> bool:
    """Whether some trained token of the micro-batch lacks a reference log-prob from the env."""
    if mb.ref_logprobs is None:
        return True
    return bool(mb.ref_logprobs.isnan()[mb.labels != IGNORE_INDEX].any())


def _mean(values: Any) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


if __name__ == "__main__":
    raise SystemExit(main())
