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
environments retry until it is up. Every run writes a new ``runs/<UTC timestamp>[-N]/`` (or ``--run-dir``):
``checkpoints/``, ``metrics.jsonl``, ``plot.png``, ``summary.json``, ``logs/``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from example_trainer.config import TrainerConfig
from example_trainer.policy import (  # noqa: F401 - their home is example_trainer.policy
    accepts_logits_to_keep,
    freeze_all_but_last_layers,
    load_policy,
    policy_logits,
)


def main(argv: list[str] | None = None) -> int:
    """Console script ``atropos-grpo``: parse flags (``--help`` lists them) and train.

    Returns:
        :func:`exit_code` of the run's summary (0 when every step or the time budget ran, 130
        after Ctrl-C, 143 after SIGTERM, 1 otherwise); 2 for a bad flag, layout, ``--resume``
        directory or pre-flight check (one line each on stderr, no traceback).
    """
    from atroposlib.errors import ConfigError
    from atroposlib.utils.flags import parse_settings

    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["config"]:
        return print_config(args[1:])
    config = parse_settings(build_parser(), args)
    try:
        summary = train(config)
    except ConfigError as exc:  # pre-flight, batch layout, --fsdp, --resume: the message is the fix
        print(f"atropos-grpo: {exc}", file=sys.stderr)
        return 2
    return exit_code(summary, config.training_steps)


def build_parser(prog: str = "atropos-grpo", description: str | None = None) -> Any:
    """The ``atropos-grpo`` parser: one kebab-case flag per :class:`TrainerConfig` field."""
    from atroposlib.utils.flags import settings_parser

    return settings_parser(
        TrainerConfig, prog=prog,
        description=description or "Train a policy with GRPO-family losses on batches from "
        "run-api, pushing each step's weights to vLLM (one it launches, or --vllm-url servers). "
        "Every flag also takes underscores (--batch_size). `atropos-grpo config [--json] "
        "[flags]` prints the settings the flags resolve to and exits.",
        docs="docs/guides/trainer.md")


def print_config(argv: list[str]) -> int:
    """``atropos-grpo config [--json] [flags]``: print the resolved settings; train nothing.

    The settings are what ``atropos-grpo [flags]`` would train with (defaults, then
    ``ATROPOS_GRPO_*`` variables, then flags), as YAML (the ``trainer:`` section of an
    atropos-launch file) or as one JSON object; ``api_key``/``vllm_api_key`` print as ``***``.

    Returns:
        0; a bad flag exits with code 2 (``SystemExit``), as it does for training.
    """
    from atroposlib.utils.flags import add_config_flags, parse_settings, settings_text

    parser = build_parser("atropos-grpo config", "Print the settings that atropos-grpo with "
                          "these flags would train with (defaults < ATROPOS_GRPO_* variables < "
                          "flags), then exit. Every flag also takes underscores.")
    add_config_flags(parser)
    namespace = parser.parse_args(argv)
    config = parse_settings(parser, namespace)
    print(settings_text(config.model_dump(mode="json"), namespace.json))
    return 0


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
    (null: none); ``failed_part`` names what failed (``vllm``, ``run-api`` or ``trainer``;
    null without an error or after Ctrl-C).

    An exception (a dead vLLM found by the health watch, an error in a step, a second Ctrl-C)
    first saves ``checkpoints/step_<k>`` for the last finished step ``k`` when no checkpoint
    of it exists yet (single process only: see :func:`example_trainer.stopping.save_on_exit`).

    Raises:
        ApiError: run-api unreachable or refusing the registration.
        InferenceError: vLLM did not start or refused a weight update.
        TimeoutError: no batch arrived within ``batch_timeout`` seconds.
    """
    import torch

    from atroposlib.utils.heap import release_free_heap
    from example_trainer import checkpoint as ckpt_io
    from example_trainer import distributed
    from example_trainer.policy import load_training_policy
    from example_trainer.precision import resolve_precision
    from example_trainer.run import TrainingRun, make_run_dir
    from example_trainer.step import StepRunner
    from example_trainer.stopping import stop_requested

    wall_start = time.perf_counter()
    device = torch.device("cuda" if config.device == "cuda" or (
        config.device == "auto" and torch.cuda.is_available()) else "cpu")
    given = (config.mixed_precision, config.vllm_dtype)
    config = resolve_precision(config, device.type)  # bf16 only where this machine computes it natively
    if given != (config.mixed_precision, config.vllm_dtype):
        print(f"[grpo] precision for this machine: mixed_precision={config.mixed_precision} "
              f"vllm_dtype={config.vllm_dtype} (from {given[0]}, {given[1]})", flush=True)
    # under torchrun: check the batch layout, join the process group (rank 0 talks to the API)
    dist = distributed.setup(config, device)
    device = dist.device
    if config.rollout_engine == "hf" and dist.enabled:
        from atroposlib.errors import ConfigError

        raise ConfigError("rollout_engine=hf samples inside one trainer process; run it without "
                          "torchrun (one process), or use --rollout-engine vllm")
    # checked before anything heavy loads: a bad --resume fails in a second, with the fix
    resume = ckpt_io.require_checkpoint(config.resume, config.lora_r > 0) if config.resume else None
    # every rank (cheap probes), so none waits on a rank that failed; before the model loads
    # and vLLM starts, so a wrong URL or path fails in seconds
    _preflight(config)
    run_dir = make_run_dir(config, dist)
    policy = load_training_policy(config, dist, resume, device)
    stepper = StepRunner(config, dist, policy, device)
    run = TrainingRun(config, dist, run_dir, policy, resume, wall_start)
    failure: BaseException | None = None
    try:
        run.start_vllm()
        run.evaluate_before()
        run.register()
        last_step_total = 0.0
        for step in range(policy.start_step + 1, config.training_steps + 1):
            if stop_requested(dist, run.stop):  # rank 0 decides for every rank
                print("[grpo] stop requested: finishing early", flush=True)
                run.stopped = "stop_requested"
                break
            if run.out_of_budget(last_step_total):
                break
            # ---------------------------------------------------------- 1. one batch
            wait_start = time.perf_counter()
            batch = _shared_batch(dist, run.client, config.batch_timeout, run.stop,
                                  run.replay.batches.pop(step, None),
                                  first=step == policy.start_step + 1, batch_size=config.batch_size)
            if batch is None:  # a stop was requested while waiting (or vLLM died: raised here)
                stop_requested(dist, run.stop)
                run.stopped = "stop_requested"
                break
            wait_s = time.perf_counter() - wait_start
            served, batch = batch, run.guard.filter(step, batch)  # bad groups dropped, one error line each
            if not batch:  # nothing left: the step counts, no update (never fetched again)
                run.bundles.write(step, served, [], 0.0, None, None)
                run.steps_done = step
                run.runlog.log(step, {"skipped_groups": run.guard.last_step_dropped,
                                      "batch_wait_seconds": wait_s, **run.ledger.step(served, [])})
                continue
            # ---------------------------------------------------------- 2-3. loss, backward, optimizer
            progress, rng = run.lr_progress(step), run.bundles.rng()  # RNG before the step: replay restores it
            with run.vllm.training(step):  # rollout_engine hf: no sampling while the weights change
                metrics = stepper.run(step, batch, progress)
            run.bundles.write(step, served, batch, progress, rng, metrics)  # batch, advantages, loss
            run.steps_done = step  # from here on a checkpoint holds this step's update
            stop_requested(dist, run.stop)  # vLLM died during the step: end before syncing to it
            # ---------------------------------------------------------- 4. sync vLLM
            sync_metrics = run.maybe_sync(step)
            if config.release_free_heap:  # freed grads, activations and sync copies leave the RSS
                trim_start = time.perf_counter()
                sync_metrics["memory/heap_released_mb"] = release_free_heap() / 2**20
                sync_metrics["memory/heap_release_seconds"] = time.perf_counter() - trim_start
            # ---------------------------------------------------------- 5. checkpoint
            if config.checkpoint_interval and step % config.checkpoint_interval == 0:
                run.save_checkpoint(f"step_{step}")
            # ---------------------------------------------------------- 6. log
            run.runlog.log(step, {**metrics, "skipped_groups": run.guard.last_step_dropped,
                                  "batch_wait_seconds": wait_s, **sync_metrics,
                                  **run.ledger.step(served, batch)}, progress=run.progress(step))
            last_step_total = time.perf_counter() - wait_start
            # ---------------------------------------------------------- 7. periodic eval
            if config.eval_interval and step % config.eval_interval == 0 and step != config.training_steps:
                if step % config.weight_sync_interval != 0:
                    run.sync_vllm(step)
                run.evaluate(step)
        run.finish_training()  # final checkpoint and evaluation
    except BaseException as exc:
        failure = exc
        run.save_on_failure(exc)
        raise
    finally:
        summary = run.close(failure)
    return summary


def wait_for_batch(client: Any, timeout: float, stop: Any, first: bool = False,
                   batch_size: int | None = None) -> list[dict[str, Any]] | None:
    """Poll ``GET /batch`` until it returns a batch (one batch only: no draining).

    Args:
        client: an :class:`~atroposlib.api.client.AtroposClient`.
        timeout: seconds before giving up.
        stop: object whose ``requested`` turns True on SIGINT/SIGTERM.
        first: whether this is the run's first batch (for the waiting line).
        batch_size: sequences per batch (for the waiting line).

    Every :data:`WAIT_REPORT_SECONDS` of waiting it prints what it waits for (run-api's queue,
    from ``GET /status``).

    A ``/batch`` call that got no answer (run-api restarting, connection lost) is polled
    again until ``timeout``: the client then asks for the step it expected (``GET
    /batch?step=N``), so a batch the server served but whose reply was lost is not skipped.

    Returns:
        The batch (list of groups), or None when a stop was requested.

    Raises:
        TimeoutError: no batch within ``timeout`` seconds; the message says what to check.
        ApiUnavailableError: run-api still unreachable at the deadline.
    """
    from atroposlib.errors import ApiError, ApiUnavailableError
    from example_trainer.progress import waiting_text

    begin = time.monotonic()
    deadline = begin + timeout
    next_report = begin + WAIT_REPORT_SECONDS
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
        if time.monotonic() >= next_report:
            next_report += WAIT_REPORT_SECONDS
            try:
                status = client.status()
            except ApiError:
                status = None
            print(f"[grpo] {waiting_text(status, time.monotonic() - begin, first, batch_size)}", flush=True)
        time.sleep(delay)
        delay = min(delay * 1.5, POLL_MAX_SECONDS)
    return None


#: longest pause between two ``GET /batch`` polls while waiting for a batch
POLL_MAX_SECONDS = 0.25
#: seconds between two lines saying what a wait for a batch waits for
WAIT_REPORT_SECONDS = 30.0


def _preflight(config: TrainerConfig) -> None:
    """Check run-api (``--api-url``), the model path and external ``--vllm-url`` servers in seconds.

    Raises:
        PreflightError: one line per problem, each with its fix.
    """
    import os

    from atroposlib.utils import preflight as pf
    from atroposlib.utils.api_key import API_KEY_ENV

    # with weight_sync none the trainer never talks to vLLM, so its URL is not checked
    vllm_urls = [u.strip() for u in (config.vllm_url or "").split(",") if u.strip()]
    if config.weight_sync == "none":
        vllm_urls = []
    pf.raise_on_problems([
        pf.check_model_path(config.model, "--model"),
        pf.check_run_api(config.api_url, "--api-url"),
        *(pf.check_inference_server(url, None, "--vllm-url", "--served-model-name",
                                    api_key=config.vllm_api_key or os.environ.get(API_KEY_ENV))
          for url in vllm_urls),
    ])


def _shared_batch(dist: Any, client: Any, timeout: float, stop: Any,
                  ready: list[dict[str, Any]] | None = None, **waiting: Any) -> list[dict[str, Any]] | None:
    """Rank 0 pulls one batch with :func:`wait_for_batch`; every rank returns it (None: stop).

    ``ready`` (rank 0): the step's batch, already fetched again after a resume (``[]``: lost);
    then nothing is pulled. ``waiting``: :func:`wait_for_batch`'s ``first`` and ``batch_size``.

    Raises:
        TimeoutError, ApiError: on rank 0, as :func:`wait_for_batch`.
        RuntimeError: on the other ranks, when rank 0 got no batch (the message says why).
    """
    if not dist.enabled:
        return ready if ready is not None else wait_for_batch(client, timeout, stop, **waiting)
    try:
        batch = None if not dist.is_main else ready if ready is not None else wait_for_batch(
            client, timeout, stop, **waiting)
    except Exception as exc:
        dist.from_main(f"rank 0 got no batch: {type(exc).__name__}: {exc}")
        raise
    shared = dist.from_main(batch)
    if isinstance(shared, str):
        raise RuntimeError(shared)
    return shared


if __name__ == "__main__":
    raise SystemExit(main())
