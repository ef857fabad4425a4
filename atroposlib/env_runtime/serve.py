"""Serve mode: register with the trajectory API and keep it supplied with scored groups.

:class:`ServeLoop` runs the rollouts and reacts to the trainer's steps; its parts each have a
module: the API session (:mod:`.api_session`), the outbox and its sender (:mod:`.outbox`), and
the rollout scheduling rules (:mod:`.scheduling`). The loop:

* registers with ``POST /register-env`` (waiting while the API says "wait for trainer to
  start"), reads ``GET /info``, then polls ``GET /status-env`` every ``status_interval`` s with
  ONE reused HTTP client;
* keeps at most ``max_num_workers`` rollout groups in flight and stops SPAWNING (never
  cancels) while the API queue, our unsent groups and the rollouts in flight fill the
  off-policy window, counting each rollout in flight as the groups that recent rollouts
  yielded (:func:`inflight_cap`: dropped all-same-score groups do not hold the window's place);
* follows the trainer: it measures the trainer's step interval and its own rollout latency
  (:class:`~atroposlib.env_runtime.pace.PaceTracker`), narrows the window from
  ``max_batches_offpolicy`` to what run-api's ``max_staleness`` allows
  (:func:`offpolicy_window`), and with ``max_num_workers=-1`` raises the rollout cap above
  the per-server default to what keeps the trainer fed (:func:`demand_cap`);
* finished groups go to a bounded local outbox; one sender task posts them with retries and
  backoff (gzip via the client) and keeps them through API outages; when the API has forgotten
  this env (404, e.g. after a restart) it re-registers and resends; every post of one group
  carries the same ``Idempotency-Key``, so a retry after a lost reply is not stored twice;
* each item goes through :func:`~atroposlib.env_runtime.step.run_item`; an inference outage
  re-queues the item and backs off instead of dropping it; a group past ``rollout_timeout``
  (a slow server, not an outage) is counted and dropped without backing off; a rollout that
  raises is logged, counted and dropped; while every rollout fails, or has its groups dropped as too long /
  invalid / of the wrong size (a config problem), spawning backs off instead of spinning;
* the loop owns the env's :class:`~atroposlib.envs.run_state.RunState` (env id, step, status,
  trainer limits, counters); the env reads it and its config is frozen while serving;
* rollouts past ``worker_timeout`` are cancelled and their item re-queued (FIFO backlog);
* the stop event (the CLI sets it on SIGINT/SIGTERM through :data:`SERVE_STOP_EVENT`) or reaching ``total_steps`` stops spawning, flushes the
  outbox (bounded wait) and calls ``POST /disconnect-env``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from atroposlib.env_runtime.api_session import ApiSession
from atroposlib.env_runtime.delivery import deliver_groups
from atroposlib.env_runtime.filtering import ItemFilter, next_item
from atroposlib.env_runtime.metrics import progress_line
from atroposlib.env_runtime.outbox import OUTBOX_MAX_GROUPS, Outbox
from atroposlib.env_runtime.pace import RolloutBudget
from atroposlib.env_runtime.scheduling import (
    RolloutPacer,
    inflight_cap,
    offpolicy_room,
    spawn_backoff,
    total_steps_reached,
)
from atroposlib.env_runtime.sinks import OutboxSink, WandbSink, close_sinks, find_sink, local_sinks
from atroposlib.env_runtime.step import Skip, run_item
from atroposlib.envs.config import EvalHandlingEnum
from atroposlib.envs.run_state import ROLLOUT_POLICY_VERSION, RunState
from atroposlib.inference.policy_version import collect_served_versions

if TYPE_CHECKING:
    from atroposlib.api.client import AsyncAtroposClient
    from atroposlib.envs.base import BaseEnv

logger = logging.getLogger(__name__)

#: The stop event a ServeLoop started in this context uses (the CLI sets it on SIGINT/SIGTERM).
SERVE_STOP_EVENT: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar(
    "serve_stop_event", default=None)


class ServeLoop:
    """Runs one env in serve mode (see module docstring). ``await ServeLoop(env).run()``."""

    def __init__(
        self,
        env: BaseEnv,
        status_interval: float = 1.0,
        register_interval: float = 1.0,
        flush_timeout: float = 30.0,
        inference_backoff_max: float = 30.0,
        stop_event: asyncio.Event | None = None,
        reject_streak: int = 20,
    ):
        """Prepare the loop (no I/O).

        Args:
            env: the environment to run.
            status_interval: seconds between ``/status-env`` polls.
            register_interval: seconds between ``/register-env`` attempts while waiting.
            flush_timeout: seconds allowed at shutdown to send unsent groups.
            inference_backoff_max: longest pause (s) before retrying after an inference outage.
            stop_event: set it to stop serving (default: :data:`SERVE_STOP_EVENT`, else a new
                event).
            reject_streak: after this many rollouts in a row whose groups were all dropped as
                ``too_long`` / ``invalid`` / ``wrong_size`` (a configuration problem, not bad
                luck), spawning backs off like it does for errors and one warning says why.

        The loop binds a fresh :class:`RunState` to the env and freezes the env's config.
        """
        self.env = env
        self.config = env.config
        self.status_interval = status_interval
        self.state = RunState.for_config(
            env.config, sinks=local_sinks(env), outbox=OutboxSink(OUTBOX_MAX_GROUPS)
        )
        env.config.freeze()
        env.bind_run_state(self.state)
        self.stop_event: asyncio.Event = stop_event or SERVE_STOP_EVENT.get() or asyncio.Event()
        self.session = ApiSession(env, self.state, self.stop_event, register_interval)
        self.outbox = Outbox(self.session, self.state.outbox.queue, flush_timeout)
        self.pacer = RolloutPacer(env, self.state, inference_backoff_max, reject_streak)
        self.backlog: deque[Any] = deque()
        self.workers: dict[asyncio.Task, tuple[Any, float]] = {}
        self.budget = RolloutBudget(env, self.state)  # rollouts in flight: window, demand, yields
        self.eval_task: asyncio.Task | None = None
        self.wake = asyncio.Event()
        self.status: dict[str, Any] = {}
        self.last_progress_log = time.monotonic()
        self.finished = False
        self.metrics: Any = None  # the --env.metrics_port endpoint while serving
        self.item_filter = ItemFilter.for_env(env)  # None unless --env.item_filter.enabled

    @property
    def pace(self) -> Any:
        """The budget's :class:`~atroposlib.env_runtime.pace.PaceTracker`."""
        return self.budget.pace

    def window(self) -> Any:
        """The off-policy window now (:meth:`RolloutBudget.window` of the last status)."""
        return self.budget.window(self.status)

    @property
    def client(self) -> AsyncAtroposClient:
        """The API client (the session's)."""
        return self.session.client

    @client.setter
    def client(self, client: AsyncAtroposClient) -> None:
        self.session.client = client

    async def setup_wandb(self) -> None:
        """Start a W&B run in the trainer's project/group (waits up to 60 s for them).

        Called after registration, when the trainer has normally published them already.
        """
        sink = find_sink(self.state.sinks, WandbSink)
        if sink is None:
            return
        project, group = await self.session.wandb_project()
        if not project:
            logger.warning("trainer did not publish a W&B project; logging without one")
        sink.start(project=project, group=group)

    # ------------------------------------------------------------------ workers
    async def _worker(self, item: Any) -> None:
        env = self.env
        # this task's own context: its groups carry the version of the weights that served them
        # (reported by inference nodes), else the trainer step when they started
        ROLLOUT_POLICY_VERSION.set(self.state.curr_step)
        collect_served_versions()
        started = time.monotonic()
        try:
            outcome = await run_item(env, item)
            if outcome.reason is Skip.INFERENCE:
                self.backlog.appendleft(item)
            self.pacer.note(outcome)
            if outcome.reason is not Skip.INFERENCE:
                self.budget.note_rollout(len(outcome.groups), time.monotonic() - started)
            self.backlog.extend(outcome.backlog)
            if self.item_filter is not None:
                self.item_filter.note(item, outcome.scores)
            if outcome.groups:
                await deliver_groups(env, outcome.groups, item, send_to_api=True)
        finally:
            try:
                await env.cleanup()
            except Exception:  # noqa: BLE001 - cleanup failures must not kill the worker loop
                logger.exception("cleanup() failed")

    def _on_worker_done(self, task: asyncio.Task) -> None:
        self.workers.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.env.stats["worker_crashes"] += 1
            logger.error("worker crashed: %r", exc, exc_info=exc)
        self.wake.set()

    def worker_cap(self) -> int:
        """Rollouts allowed in flight now: the budget's cap, scaled or stopped during evaluation.

        :meth:`RolloutBudget.cap`; while an evaluation runs, ``eval_handling`` ``STOP_TRAIN``
        gives 0 and ``LIMIT_TRAIN`` scales the cap by ``eval_limit_ratio``.
        """
        scale = None
        if self.eval_task is not None and not self.eval_task.done():
            if self.config.eval_handling == EvalHandlingEnum.STOP_TRAIN:
                return 0
            if self.config.eval_handling == EvalHandlingEnum.LIMIT_TRAIN:
                scale = self.config.eval_limit_ratio
        return self.budget.cap(self.status, self.outbox.unsent(), scale)

    def pace_report(self) -> dict[str, float]:
        """The adaptation's numbers now (:meth:`RolloutBudget.report`, with this loop's cap)."""
        return {"rollout_cap": float(self.worker_cap()), **self.budget.report(self.status)}

    async def spawn_workers(self) -> None:
        """Start rollouts until the cap is reached or no item is available."""
        if self.pacer.paused():
            return
        cap = self.worker_cap()
        while len(self.workers) < cap and not self.stop_event.is_set():
            if self.backlog:
                item = self.backlog.popleft()
            else:
                item = await next_item(self.env, self.item_filter)
                if item is None:
                    return
            task = asyncio.get_running_loop().create_task(self._worker(item))
            self.workers[task] = (item, time.monotonic())
            task.add_done_callback(self._on_worker_done)

    def reap_timeouts(self) -> None:
        """Cancel rollouts older than ``worker_timeout`` and re-queue their items."""
        timeout = self.config.worker_timeout
        if timeout <= 0:
            return
        now = time.monotonic()
        for task, (item, started) in list(self.workers.items()):
            if now - started > timeout and not task.done():
                task.cancel()
                self.backlog.append(item)
                self.env.stats["rollouts_timed_out"] += 1
                logger.warning("rollout exceeded worker_timeout=%ss; cancelled, item re-queued", timeout)

    # ------------------------------------------------------------------ status & step events
    async def poll_status(self) -> None:
        """Fetch ``/status-env`` (the session re-registers when forgotten); react to step changes."""
        status = await self.session.read_status()
        if status is None:
            return
        self.outbox.sent_since_status = 0
        self.status = status
        self.state.status = status
        self.env.server.update_weight(float(status.get("env_weight", 1.0)))
        new_step = int(status.get("current_step", self.state.curr_step))
        self.budget.pace.note_step(new_step, time.monotonic())
        if new_step != self.state.curr_step:
            await self.on_step(self.state.curr_step, new_step)

    async def on_step(self, old: int, new: int) -> None:
        """Evaluation / checkpoint / logging triggers when the trainer step moves."""
        env = self.env
        every = self.config.steps_per_eval
        if every > 0 and new // every > old // every:
            if self.eval_task is not None and not self.eval_task.done():
                logger.warning("previous evaluation still running at step %d; skipping this one", new)
            else:
                self.eval_task = asyncio.get_running_loop().create_task(self._run_eval())
        interval = env.checkpoint_interval
        if interval and interval > 0 and new // interval > old // interval:
            try:
                env.save_checkpoint((new // interval) * interval)
            except Exception:  # noqa: BLE001 - a failed checkpoint must not stop serving
                logger.exception("save_checkpoint failed")
        self.state.curr_step = new
        if self.state.items_sent_this_step >= self.config.min_items_sent_before_logging:
            self.state.items_sent_this_step = 0
            try:
                await env.wandb_log({f"train/{k}": v for k, v in self.pace_report().items()})
            except Exception:  # noqa: BLE001 - logging must not stop serving
                logger.exception("wandb_log failed")

    async def _run_eval(self) -> None:
        try:
            metrics = await self.env.evaluate()
            if metrics:
                await self.env.wandb_log(dict(metrics))
        except Exception:  # noqa: BLE001 - a failing eval is logged, serving goes on
            self.env.stats["eval_failures"] += 1
            logger.exception("evaluate() failed")

    def reached_total_steps(self) -> bool:
        """True when already-queued data will carry the trainer past ``total_steps``."""
        return total_steps_reached(self.state.curr_step, self.state.total_steps, self.status,
                                   self.config.group_size, self.state.batch_size)

    def log_progress(self, every: float = 60.0) -> None:
        """Log :func:`~atroposlib.env_runtime.metrics.progress_line` every ``every`` s."""
        now = time.monotonic()
        if now - self.last_progress_log >= every:
            self.last_progress_log = now
            logger.info("%s", progress_line(self))

    # ------------------------------------------------------------------ main
    async def run(self) -> None:
        """Register, then loop until stopped or ``total_steps`` is reached; always clean up."""
        env = self.env
        session = self.session
        try:
            await env.setup()
            await session.register(first=True)  # waits for the trainer, which publishes W&B info
            if self.stop_event.is_set():
                return
            await self.setup_wandb()
            await session.read_info()
            if self.config.metrics_port is not None:
                from atroposlib.env_runtime.metrics import serve_loop_metrics

                self.metrics = serve_loop_metrics(self, self.config.metrics_port, self.config.metrics_host)
                logger.info("Prometheus metrics at %s", self.metrics.url)
            self.outbox.start()
            while not self.stop_event.is_set():
                if time.monotonic() - session.last_status_at >= self.status_interval:
                    await self.poll_status()
                    if self.reached_total_steps():
                        logger.info("total_steps=%d reached; finishing", self.state.total_steps)
                        self.finished = True
                        break
                await self.spawn_workers()
                self.reap_timeouts()
                self.log_progress()
                self.outbox.restart_if_broken()
                self.wake.clear()
                wait = max(0.05, self.status_interval - (time.monotonic() - session.last_status_at))
                pause_left = self.pacer.inference_pause_until - time.monotonic()
                if pause_left > 0:
                    wait = min(wait, pause_left + 0.01)
                stop_wait = asyncio.ensure_future(self.stop_event.wait())
                wake_wait = asyncio.ensure_future(self.wake.wait())
                await asyncio.wait({stop_wait, wake_wait}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                for fut in (stop_wait, wake_wait):
                    fut.cancel()
        finally:
            await self.shutdown()

    async def shutdown(self) -> None:
        """Stop workers, flush unsent groups, disconnect from the API, close clients."""
        env = self.env
        if self.finished and self.workers:
            # Finished normally: let in-flight groups complete (bounded by worker_timeout).
            timeout = self.config.worker_timeout if self.config.worker_timeout > 0 else None
            await asyncio.wait(list(self.workers), timeout=timeout)
        for task in list(self.workers):
            task.cancel()
        if self.workers:
            await asyncio.gather(*self.workers, return_exceptions=True)
        if self.eval_task is not None and not self.eval_task.done():
            self.eval_task.cancel()
            await asyncio.gather(self.eval_task, return_exceptions=True)
        if env.env_id is not None:
            await self.outbox.flush()
            await self.session.disconnect()
        else:
            await self.outbox.stop()
        try:
            await env.wandb_log({})
        except Exception:  # noqa: BLE001
            logger.exception("final wandb_log failed")
        if self.metrics is not None:
            self.metrics.close()
        await close_sinks(self.state.sinks)
        await env.server.aclose()
        await self.client.aclose()
        logger.info("serve stopped; stats: %s", dict(env.stats))


async def serve(env: BaseEnv) -> None:
    """Serve mode's runner (``BaseEnv.env_manager``): ``await ServeLoop(env).run()``."""
    await ServeLoop(env).run()


__all__ = ["OUTBOX_MAX_GROUPS", "SERVE_STOP_EVENT", "ServeLoop", "inflight_cap", "offpolicy_room",
           "serve", "spawn_backoff"]
