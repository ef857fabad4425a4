"""What ``summary.json`` says about a training run: its outcome, clocks, evaluations and counters.

:func:`summary_fields` reads a finished :class:`~example_trainer.run.TrainingRun`;
:func:`~example_trainer.report.write_summary` writes the fields (rank 0).
"""

from __future__ import annotations

from typing import Any


def summary_fields(run: Any, failure: BaseException | None) -> dict[str, Any]:
    """The fields of ``summary.json`` for ``run``, once it ended (vLLM stopped, clocks fixed).

    Args:
        run: the :class:`~example_trainer.run.TrainingRun` (typed loosely: that module imports
            this one); its ``stopped`` already says how the loop ended.
        failure: the exception that ended it, or None.

    Returns:
        ``steps``, ``stopped`` (``completed``, ``time_budget``, ``stop_requested``,
        ``interrupted`` or ``error``), ``error`` and ``failed_part``, the clocks in seconds
        (``wall_seconds``, ``train_loop_seconds``, ``eval_seconds``), the evaluations
        (``eval_accuracy_before/after/delta``, ``evals``), the checkpoints, the means of
        ``sync/update_seconds`` and ``step_seconds`` over the logged steps (None without any),
        the batch guard's and weight sync's fields, replayed and lost batches, and rank 0's
        ledger (None on the other ranks).
    """
    from example_trainer.stopping import failed_part

    config, dist, history, last = run.config, run.dist, run.runlog.history, run.last_checkpoint
    return dict(
        steps=run.steps_done, training_steps=config.training_steps,
        wall_seconds=run.clock.wall_seconds(), train_loop_seconds=run.clock.train_seconds,
        eval_accuracy_before=run.eval_before, eval_accuracy_after=run.eval_after,
        eval_accuracy_delta=run.eval_after - run.eval_before,
        evals=[{"step": s, "accuracy": a} for s, a in run.runlog.evals],
        final_checkpoint=str(last) if last and last.name == "final" else None,
        last_checkpoint=str(last) if last else None,
        stopped=run.stopped, error=f"{type(failure).__name__}: {failure}" if failure is not None else None,
        failed_part=failed_part(failure),
        stop_signal=run.stop.signum if run.stopped == "stop_requested" else None,
        stopped_by_time_budget=run.out_of_time, eval_seconds=run.clock.eval_seconds,
        weight_sync=run.vllm.mode or config.weight_sync, **(run.vllm.summary() if dist.is_main else {}),
        batch_size=config.batch_size, lr=config.lr,
        mean_sync_update_seconds=_mean(h.get("sync/update_seconds") for h in history),
        mean_step_seconds=_mean(h.get("step_seconds") for h in history),
        **run.guard.summary(), replayed_batches=run.replay.replayed, lost_batches=len(run.replay.lost),
        ledger=run.ledger.summary(refresh=failure is None) if dist.is_main else None,
    )


def _mean(values: Any) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


__all__ = ["summary_fields"]
