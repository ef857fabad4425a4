"""Everything one training run owns besides its loop: run directory, vLLM, logs, checkpoints, summary.

:class:`TrainingRun` is the loop's companion in :func:`example_trainer.grpo.train`: it starts
and syncs vLLM (or pushes to inference nodes), registers with run-api (fetching again, on a
resume, the batches served after the checkpoint), checks each batch, evaluates, saves
checkpoints, and writes ``summary.json`` however the run ends.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

from example_trainer.policy import Policy


def make_run_dir(config: Any, dist: Any) -> Path:
    """The run directory (``--run-dir``, the ``--resume`` directory, or a new ``runs/<UTC time>[-N]``), created on rank 0.

    A new directory is created exclusively (:func:`~atroposlib.utils.run_dirs.new_run_dir`), so
    two trainers started in the same second do not share one.
    """
    from atroposlib.utils.run_dirs import new_run_dir

    named = config.run_dir or config.resume
    run_dir = Path(dist.from_main(named or (str(new_run_dir()) if dist.is_main else None)))
    if dist.is_main:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / "trainer_config.json").write_text(config.model_dump_json(indent=2))
        print(f"[grpo] run directory: {run_dir}", flush=True)
    return run_dir


class TrainingRun:
    """The run's parts and counters (see module docstring); the loop advances :attr:`steps_done`."""

    def __init__(self, config: Any, dist: Any, run_dir: Path, policy: Policy, resume: Any,
                 wall_start: float | None = None):
        """Set up vLLM's handle, metrics, the run log, the batch guard and the stop handler (no I/O to servers).

        Args:
            config: the :class:`~example_trainer.config.TrainerConfig`.
            dist: the run's :class:`~example_trainer.distributed.Dist`.
            run_dir: from :func:`make_run_dir`.
            policy: what the run trains.
            resume: the checkpoint resumed from, or None.
            wall_start: ``time.perf_counter()`` when the run began (default: now).
        """
        from example_trainer import checkpoint as ckpt_io
        from example_trainer.batch_checks import BatchGuard
        from example_trainer.bundles import BundleRecorder
        from example_trainer.clock import TrainClock
        from example_trainer.ledger import TrainerLedger
        from example_trainer.metrics import TrainerMetrics
        from example_trainer.report import NullRunLog, RunLog
        from example_trainer.resumed_batches import Replay
        from example_trainer.stopping import install_stop_handler
        from example_trainer.vllm_sync import VLLMSync

        self.config, self.dist, self.run_dir, self.policy, self.resume = config, dist, run_dir, policy, resume
        self.clock = TrainClock(wall_start)  # wall, training-loop and evaluation seconds
        self.vllm = VLLMSync(config, run_dir)
        start_step = policy.start_step
        if resume is not None and dist.is_main:
            past = ckpt_io.read_history(run_dir, start_step)
            ckpt_io.append_resume_marker(run_dir, start_step)
        self.prom = prom = TrainerMetrics(config.metrics_port if dist.is_main else None, config.metrics_host)
        self.runlog = RunLog(run_dir, config.use_wandb, config.wandb_project, config.wandb_group,
                             config.model_dump(mode="json"), plot_every=config.plot_every,
                             tensorboard_dir=Path(config.tensorboard_dir or run_dir / "tensorboard")
                             if config.tensorboard or config.tensorboard_dir else None,
                             observers=[prom.observe]) if dist.is_main else NullRunLog()
        if resume is not None and dist.is_main:
            self.runlog.history = [r for r in past if "loss" in r]
            self.runlog.evals = [(r["step"], r["eval/accuracy"]) for r in past if "eval/accuracy" in r]
        # every batch is checked against the model's vocabulary before the forward pass
        self.guard = BatchGuard(policy.vocab_size, config.max_token_len, whole_batch=dist.enabled,
                                report=dist.is_main,
                                on_drop=lambda reason: prom.groups_dropped.labels(reason).inc(),
                                on_skip=prom.batches_skipped.inc)
        # the trainer's half of the run ledger (trained and poison-dropped tokens; summary.json)
        self.ledger = TrainerLedger.resumed(past if resume is not None and dist.is_main else [])
        self.stop = install_stop_handler()
        self.bundles = BundleRecorder(config, run_dir, policy, dist)  # replay bundles (rank 0)
        self.watch: Any = None  # the vLLM health watch (rank 0, once vLLM is up)
        self.replay = Replay()  # resumed: the steps run-api served after the checkpoint (lost ones -> [])
        self.client: Any = None  # rank 0's AtroposClient, once registered
        self.steps_done = self.saved_step = start_step
        self.eval_before = self.eval_after = math.nan
        self.last_checkpoint: Path | None = None  # newest checkpoint this run wrote
        self.out_of_time = False
        self.stopped = "completed"  # how the loop ended; an exception overrides it in `finish`

    # ------------------------------------------------------------------ vLLM
    def start_vllm(self) -> None:
        """Start (or reach) vLLM and its health watch; push the first weights where needed."""
        from example_trainer.health import HealthWatch

        config, dist, prom = self.config, self.dist, self.prom
        if prom.port is not None:
            print(f"[grpo] Prometheus metrics at http://{config.metrics_host}:{prom.port}/metrics",
                  flush=True)
        if config.rollout_engine == "hf":
            self._start_in_process()
            return
        mode = self.vllm.choose(self.policy.model, announce=dist.is_main)  # auto -> lora/reload
        # the launched vLLM serves the starting adapter from its first second (every rank gathers)
        at_start = self.vllm.serves_adapter_as_policy
        full = self.dist.full_state_dict(self.policy.model) if at_start else None
        if dist.is_main:
            print(f"[grpo] starting vLLM ({mode} sync)...", flush=True)
            vllm_seconds = self.vllm.start(self.policy.model, full)
            print(f"[grpo] vLLM ready at {self.vllm.base_url} after {vllm_seconds:.1f}s", flush=True)
            if mode != "none":  # a dead vLLM ends the run in seconds, not at a sync
                prom.vllm_up.set(1)
                self.watch = HealthWatch(self.vllm.health_problem, on_failure=self._vllm_died).start()
        del full
        # inference nodes serve nothing until a trainer pushed weights (dist.from_main: every
        # rank must take part in the gather)
        if not at_start and (self.resume is not None or mode == "lora"
                             or dist.from_main(self.vllm.fleet is not None)):
            self.sync_vllm(self.policy.start_step)  # serve the resumed policy (or the first adapter)

    def _start_in_process(self) -> None:
        """``rollout_engine: hf``: serve the policy from this process (and watch that server)."""
        from example_trainer.health import HealthWatch

        policy = self.policy
        seconds = self.vllm.start_in_process(policy.model, policy.tokenizer, policy.start_step)
        print(f"[grpo] sampling in this process (rollout_engine hf) at {self.vllm.base_url} "
              f"after {seconds:.1f}s: no vLLM, no weight sync", flush=True)
        self.prom.vllm_up.set(1)
        self.watch = HealthWatch(self.vllm.health_problem, on_failure=self._vllm_died).start()

    def _vllm_died(self, error: BaseException) -> None:  # from the health watch's thread
        self.prom.vllm_up.set(0)
        self.stop.fail(error)

    def sync_vllm(self, version: int) -> dict[str, float]:
        """Send the current weights to vLLM (every rank gathers; rank 0 writes and reloads or pushes)."""
        full = self.dist.full_state_dict(self.policy.model)
        with self.watch.paused() if self.watch is not None else contextlib.nullcontext():  # restart
            metrics = self.vllm.sync(self.policy.model, self.policy.tokenizer, state_dict=full,
                                     background=self.config.weight_sync_overlap,
                                     version=version) if self.dist.is_main else {}
        self.dist.wait_for_main()
        return metrics

    def maybe_sync(self, step: int, force: bool = False) -> dict[str, float]:
        """Sync vLLM after ``step`` when the interval says so (or it is the last step, or ``force``)."""
        config = self.config
        if force or step % config.weight_sync_interval == 0 or step == config.training_steps:
            return self.sync_vllm(step)
        return {}

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, step: int) -> float:
        """Run ``--eval-command`` against vLLM's newest weights (rank 0); NaN without one."""
        from example_trainer.report import run_eval_command

        config = self.config
        if not config.eval_command or not self.dist.is_main:
            return math.nan
        with self.clock.evaluation():  # outside the training budget
            self.vllm.wait()  # a background sync in flight: evaluate the newest weights
            metrics = run_eval_command(
                config.eval_command, base_url=self.vllm.base_url, model_name=self.vllm.model_name,
                out_dir=self.run_dir / "evals" / f"step_{step}", step=step, metric=config.eval_metric,
                timeout=config.eval_timeout, log_path=self.run_dir / "logs" / "eval.log")
            self.runlog.log_eval(step, metrics, config.eval_metric)
        return metrics[config.eval_metric]

    def evaluate_before(self) -> None:
        """The policy before training (a resumed run reads the first run's figure)."""
        if self.resume is None:
            self.eval_before = self.evaluate(0)
        else:
            self.eval_before = next((a for s, a in self.runlog.evals if s == 0), math.nan)

    # ------------------------------------------------------------------ run-api
    def register(self) -> None:
        """Register with run-api (rank 0) with the checkpoint's step; on a resume the client then fetches again the batches served after it."""
        from atroposlib.api.client import AtroposClient
        from atroposlib.api.models import Registration
        from example_trainer.resumed_batches import announce

        config, start_step = self.config, self.policy.start_step
        if self.dist.is_main:
            client = self.client = self.ledger.client = AtroposClient(config.api_url,
                                                                      api_key=config.api_key)
            client.register(Registration(
                wandb_group=config.wandb_group or "", wandb_project=config.wandb_project or "",
                batch_size=config.batch_size, max_token_len=config.max_token_len,
                checkpoint_dir=str(self.run_dir / "checkpoints"),
                save_checkpoint_interval=config.checkpoint_interval or config.training_steps,
                starting_step=start_step, num_steps=config.training_steps,
                max_staleness=config.max_staleness, vocab_size=self.guard.vocab_size),
                announce_lost=False)  # announced below, with the groups metrics.jsonl counted
            print(f"[grpo] registered with {config.api_url}: batch_size={config.batch_size} "
                  f"max_token_len={config.max_token_len} vocab_size={self.guard.vocab_size}", flush=True)
            self.replay = announce(client.resumed, start_step, self.run_dir, config.batch_size)
            self.prom.batches_replayed.inc(self.replay.replayed)
            self.prom.batches_lost.inc(len(self.replay.lost))
            if client.resumed is None:
                self._say_waiting(client)
        self.clock.start_training()

    def _say_waiting(self, client: Any) -> None:
        """Print what the first step waits for (run-api's queue, from ``GET /status``)."""
        from atroposlib.errors import ApiError
        from example_trainer.progress import waiting_text

        try:
            status = client.status()
        except ApiError:
            status = None
        print(f"[grpo] {waiting_text(status, 0.0, True, self.config.batch_size)}", flush=True)

    def progress(self, step: int) -> str:
        """The head of step ``step``'s console line: ``step N/M``, the budget used and an ETA."""
        from example_trainer.progress import progress_text

        return progress_text(step, self.config.training_steps, self.train_elapsed(),
                             self.config.max_train_seconds, self.policy.start_step)

    def train_elapsed(self) -> float:
        """Seconds since registration, evaluations excluded (what ``--max-train-seconds`` counts; :meth:`TrainClock.elapsed`)."""
        return self.clock.elapsed()

    def out_of_budget(self, last_step_seconds: float) -> bool:
        """True when the next step (assumed as long as the last) would overrun ``--max-train-seconds``.

        Evaluations do not count: the budget is for training, however often one evaluates.
        """
        config = self.config
        elapsed = self.train_elapsed()
        if self.dist.from_main(bool(config.max_train_seconds)
                               and elapsed + last_step_seconds > config.max_train_seconds):
            print(f"[grpo] time budget of {config.max_train_seconds:.0f}s used after "
                  f"{self.steps_done} steps: finishing", flush=True)
            self.out_of_time, self.stopped = True, "time_budget"
            return True
        return False

    def lr_progress(self, step: int) -> float:
        """Step ``step``'s progress through the run for ``--lr-scheduler-type`` (rank 0's, on every rank).

        The larger of ``(step - 1) / --training-steps`` and the share of ``--max-train-seconds``
        used (evaluations excluded, as for the budget). 0 for ``constant``, which ignores it
        (and then no rank waits on rank 0's clock).
        """
        from example_trainer.optimizer import schedule_progress

        config = self.config
        if config.lr_scheduler_type == "constant":
            return 0.0
        return self.dist.from_main(schedule_progress(step, config.training_steps, self.train_elapsed(),
                                                     config.max_train_seconds))

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, name: str) -> None:
        """Write ``checkpoints/<name>`` for :attr:`steps_done` (every rank gathers, rank 0 writes)."""
        from example_trainer import checkpoint as ckpt_io
        from example_trainer import lora
        from example_trainer.vllm_sync import save_weights

        model, tokenizer, dist = self.policy.model, self.policy.tokenizer, self.dist

        def write_weights(out: Path) -> None:
            if lora.is_lora(model):
                lora.save_adapter(model, out / "adapter", full)
                if name != "final":  # a full model only where something must load one
                    return
            hf_model, weights = lora.export(model, full)  # LoRA: the adapter merged in
            save_weights(hf_model, tokenizer, out, True, state_dict=weights)

        begin = time.perf_counter()
        full = dist.full_state_dict(model)  # sharded: every rank gathers, rank 0 writes
        ckpt_io.save_checkpoint(self.run_dir / "checkpoints" / name, step=self.steps_done, model=model,
                                optimizer=self.policy.optimizer, write_weights=write_weights,
                                lora=lora.is_lora(model), is_main=dist.is_main)
        self.prom.checkpoint.observe(time.perf_counter() - begin)
        self.last_checkpoint, self.saved_step = self.run_dir / "checkpoints" / name, self.steps_done
        if dist.is_main:
            ckpt_io.prune_checkpoints(self.run_dir, self.config.checkpoint_keep)

    def save_on_failure(self, exc: BaseException) -> None:
        """Keep what this run trained since its last checkpoint before the exception propagates."""
        from example_trainer.stopping import save_on_exit

        if self.steps_done > self.saved_step:
            save_on_exit(self.dist, self.save_checkpoint, self.steps_done, exc)

    def finish_training(self) -> None:
        """After the loop: the final checkpoint, then the final evaluation (unless stopped)."""
        config = self.config
        self.clock.end_training()
        self.save_checkpoint("final")
        steps_done = self.steps_done
        if steps_done and config.eval_command and not self.dist.from_main(self.stop.requested):
            if steps_done % config.weight_sync_interval and steps_done != config.training_steps:
                self.sync_vllm(steps_done)
            self.eval_after = self.evaluate(steps_done)

    # ------------------------------------------------------------------ the end, however it came
    def close(self, failure: BaseException | None) -> dict[str, Any]:
        """Stop vLLM and the watchers, write ``summary.json`` (rank 0) and return the summary."""
        from example_trainer.report import write_summary
        from example_trainer.run_summary import summary_fields

        dist, runlog = self.dist, self.runlog
        self.stop.restore()  # the caller's SIGINT/SIGTERM handlers again
        if self.watch is not None:
            self.watch.stop()
        self.prom.close()
        self.clock.end_training()  # interrupted inside the loop (or before it began)
        if failure is not None:
            self.stopped = "interrupted" if isinstance(failure, KeyboardInterrupt) else "error"
        dist.close(failure)  # the other ranks wait here for rank 0's final eval
        if dist.is_main:
            self.vllm.stop()
            self.vllm.cleanup()  # the sync copy duplicates checkpoints/final
        if runlog.history:
            runlog.plot(self.run_dir / "plot.png")
        summary = write_summary(self.run_dir / "summary.json" if dist.is_main else None,
                                **summary_fields(self, failure))
        runlog.close()
        if dist.is_main:
            print(f"[grpo] summary: {summary}", flush=True)
        return summary


__all__ = ["TrainingRun", "make_run_dir"]
