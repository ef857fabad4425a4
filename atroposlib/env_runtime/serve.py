"""Serve mode: register with the trajectory API and keep it supplied with scored groups.

The loop (with upstream's weaknesses fixed):

* registers with ``POST /register-env`` (waiting while the API says "wait for trainer to
  start"), reads ``GET /info``, then polls ``GET /status-env`` every ``status_interval`` s with
  ONE reused HTTP client;
* keeps at most ``max_num_workers`` rollout groups in flight and stops SPAWNING (never
  cancels) while the API queue plus our unsent groups reach ``max_batches_offpolicy`` batches,
  counting each rollout in flight as the groups that recent rollouts yielded
  (:func:`inflight_cap`: dropped all-same-score groups do not hold the window's place);
* finished groups go to a bounded local outbox; one sender task posts them with retries and
  backoff (gzip via the client) and keeps them through API outages; when the API has forgotten
  this env (404, e.g. after a restart) it re-registers and resends; every post of one group
  carries the same ``Idempotency-Key``, so a retry after a lost reply is not stored twice;
* each item goes through :func:`~atroposlib.env_runtime.step.run_item`; an inference outage
  re-queues the item and backs off instead of dropping it; a rollout that raises is logged,
  counted and dropped; while every rollout fails, or has its groups dropped as too long /
  invalid / of the wrong size (a config problem), spawning backs off instead of spinning;
* the loop owns the env's :class:`~atroposlib.envs.run_state.RunState` (env id, step, status,
  trainer limits, counters); the env reads it and its config is frozen while serving;
* timed-out rollouts are cancelled and their item re-queued (FIFO backlog);
* the stop event (the CLI sets it on SIGINT/SIGTERM through :data:`SERVE_STOP_EVENT`) or reaching ``total_steps`` stops spawning, flushes the
  outbox (bounded wait) and calls ``POST /disconnect-env``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import time
from collections import Counter, deque
from typing import TYPE_CHECKING, Any

import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from atroposlib.api.client import AsyncAtroposClient, new_idempotency_key
from atroposlib.api.models import RegisterEnv
from atroposlib.env_runtime.sinks import OutboxSink, WandbSink, close_sinks, find_sink, local_sinks
from atroposlib.env_runtime.step import Skip, run_item
from atroposlib.envs.config import EvalHandlingEnum
from atroposlib.envs.run_state import ROLLOUT_POLICY_VERSION, RunState, batch_share
from atroposlib.errors import (
    ApiBackpressureError,
    ApiRejectedError,
    ApiUnavailableError,
    ConfigError,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from atroposlib.envs.base import BaseEnv

logger = logging.getLogger(__name__)

#: Finished groups kept locally while the API is unreachable; workers wait when it is full.
OUTBOX_MAX_GROUPS = 256
#: Consecutive 5xx answers from /status-env after which the env registers again.
STATUS_ERRORS_BEFORE_REREGISTER = 5
#: The stop event a ServeLoop started in this context uses (the CLI sets it on SIGINT/SIGTERM).
SERVE_STOP_EVENT: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar(
    "serve_stop_event", default=None)


class _NotRegistered(Exception):
    """The API does not know our env_id any more (404); re-register and retry."""


#: Drops that repeat for every item while the env or trainer config is wrong (serve backs off
#: after a run of them); equal-score drops are normal and are not among them.
_CONFIG_REJECTS = frozenset({Skip.TOO_LONG, Skip.INVALID, Skip.WRONG_SIZE})


def offpolicy_room(
    status: dict[str, Any],
    batch_size: int,
    group_size: int,
    max_batches_offpolicy: int,
    min_batch_allocation: float | None,
    unsent_groups: int = 0,
) -> int | None:
    """How many more groups this env may have in flight without exceeding the staleness window.

    ``room = max_batches_offpolicy * derived_batch_size // group_size - queue_size - unsent``,
    raised to the env's minimum-allocation floor when ``min_batch_allocation`` is set.

    Args:
        status: the ``/status-env`` response.
        batch_size: trainer batch size in sequences (> 0).
        group_size: this env's group size.
        max_batches_offpolicy: staleness window in batches; <= 0 disables the limit.
        min_batch_allocation: this env's reserved fraction of each batch, or None.
        unsent_groups: finished groups the status does not count yet (local outbox, and
            groups sent since the status was read).

    Returns:
        The room in groups (may be <= 0), or None when there is no limit.
    """
    if max_batches_offpolicy <= 0 or batch_size <= 0:
        return None
    derived = batch_share(batch_size, status, min_batch_allocation)
    room = max_batches_offpolicy * derived // group_size - int(status.get("queue_size", 0)) - unsent_groups
    if min_batch_allocation is not None:
        m = max(1, int(status.get("max_group_size", group_size)))
        s = int(status.get("self_queue_size", 0))
        floor = max(
            0,
            math.ceil(
                (
                    (math.ceil(min_batch_allocation * batch_size * max_batches_offpolicy / m) + m // group_size) * m
                    - math.floor(m * s / (m / group_size))
                )
                / group_size
            ),
        )
        room = max(room, floor - unsent_groups)
    return room


def spawn_backoff(n: int) -> float:
    """Pause before the next spawn after the ``n``-th (from 0) repeated failure: 0.1 s doubling to 10 s."""
    return min(10.0, 0.1 * 2 ** min(n, 7))


YIELD_WINDOW = 32
"""Finished rollouts that :func:`inflight_cap`'s yield estimate looks back on."""


def inflight_cap(room: int, recent_yields: Sequence[int], min_yield: float = 0.125) -> int:
    """Rollouts that may be in flight when ``room`` more groups fit the staleness window.

    A rollout in flight does not always become a group: with ``ensure_scores_are_not_same``
    (DAPO's dynamic sampling, Yu et al. 2025, arXiv:2503.14476, section 3.2) groups whose
    scores are all equal are dropped, often most of them once a policy is good. Counting each
    rollout in flight as a whole group then starves the trainer: with 2 batches of room and 70%
    dropped, barely one useful group is sampled at a time. So each rollout counts as the mean
    number of usable groups that the recent rollouts yielded, and the expected number of groups
    stays within the window::

        cap = floor(room / max(mean(recent_yields), min_yield))     (room if no yield is known)

    Args:
        room: groups that still fit the window (:func:`offpolicy_room`); <= 0 gives 0.
        recent_yields: usable groups per recently finished rollout (newest last); rollouts
            whose inference failed are not in it.
        min_yield: the smallest yield assumed (bounds the cap at ``room / min_yield``).

    Returns:
        The most rollouts to keep in flight (``max_num_workers`` still bounds it).
    """
    if room <= 0:
        return 0
    if not recent_yields:
        return room
    expected = max(sum(recent_yields) / len(recent_yields), min_yield)
    return max(room, math.floor(room / expected))


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
        self.register_interval = register_interval
        self.flush_timeout = flush_timeout
        self.inference_backoff_max = inference_backoff_max
        self.client = AsyncAtroposClient(env.config.rollout_server_url, max_attempts=3, max_retry_seconds=30)
        self.state = RunState.for_config(
            env.config, sinks=local_sinks(env), outbox=OutboxSink(OUTBOX_MAX_GROUPS)
        )
        env.config.freeze()
        env.bind_run_state(self.state)
        self.outbox: asyncio.Queue = self.state.outbox.queue
        self.backlog: deque[Any] = deque()
        self.workers: dict[asyncio.Task, tuple[Any, float]] = {}
        self.recent_yields: deque[int] = deque(maxlen=YIELD_WINDOW)  # usable groups per rollout
        self.eval_task: asyncio.Task | None = None
        self.sender_task: asyncio.Task | None = None
        self.sending: dict[str, Any] | None = None
        self.sending_key: str | None = None  # the Idempotency-Key of `sending`
        self.wake = asyncio.Event()
        self.stop_event: asyncio.Event = stop_event or SERVE_STOP_EVENT.get() or asyncio.Event()
        self.register_lock = asyncio.Lock()
        self.status: dict[str, Any] = {}
        self.last_status_at = 0.0
        self.inference_pause_until = 0.0
        self.inference_backoff = 1.0
        self.consecutive_errors = 0
        self.reject_streak = reject_streak
        self.consecutive_rejects = 0
        self.reject_reasons: Counter[Skip] = Counter()  # reasons within the current streak
        self.sent_since_status = 0
        self.status_server_errors = 0
        self.last_progress_log = time.monotonic()
        self.finished = False

    # ------------------------------------------------------------------ registration
    async def register(self, first: bool = True) -> None:
        """Register (or re-register) with the API, waiting for the trainer to start."""
        env = self.env
        desired = self.config.wandb_name or env.name or type(env).__name__
        payload = RegisterEnv(
            max_token_length=self.config.max_token_length,
            desired_name=desired,
            weight=self.config.inference_weight,
            group_size=self.config.group_size,
            min_batch_allocation=self.config.min_batch_allocation,
        )
        waited = 0
        while not self.stop_event.is_set():
            try:
                response = await self.client.register_env(payload)
            except (ApiUnavailableError, ApiBackpressureError) as exc:
                logger.warning("cannot register with %s yet (%s); retrying", self.client.base_url, exc)
                await self._sleep(min(10.0, self.register_interval * 5))
                continue
            if response.get("status") == "success":
                break
            if waited % 30 == 0:
                logger.info("API says %r; waiting for the trainer", response.get("status"))
            waited += 1
            await self._sleep(self.register_interval)
        else:
            return
        state = self.state
        state.env_id = int(response["env_id"])
        state.wandb_prepend = response.get("wandb_name")
        state.checkpoint_dir = response.get("checkpoint_dir")
        state.checkpoint_interval = int(response.get("checkpoint_interval") or -1)
        if first:
            state.curr_step = int(response.get("starting_step") or 0)
            if state.total_steps == -1:
                num_steps = int(response.get("num_steps") or -1)
                if num_steps == -1:
                    raise ConfigError(
                        "total_steps is -1 (take it from the trainer) but the trainer registered "
                        "num_steps=-1; set --env.total_steps"
                    )
                state.total_steps = num_steps
            if state.curr_step > 0:
                env.load_checkpoint()
        logger.info(
            "%s as env_id=%d (%s) at step %d",
            "registered" if first else "re-registered",
            env.env_id,
            env.wandb_prepend,
            env.curr_step,
        )

    async def reregister(self, stale_env_id: int | None) -> None:
        """Re-register once per loss of registration (concurrent callers share one attempt)."""
        async with self.register_lock:
            if self.env.env_id != stale_env_id:
                return
            logger.warning("API no longer knows env_id=%s (restarted?); re-registering", stale_env_id)
            await self.register(first=False)
            await self.read_info()

    async def read_info(self) -> None:
        """Adopt ``batch_size`` and ``max_token_len`` from ``GET /info``.

        Raises:
            ConfigError: ``group_size`` exceeds the trainer's batch size.
        """
        info = await self.client.info()
        batch_size = int(info.get("batch_size", -1))
        if batch_size != -1:
            if self.config.group_size > batch_size:
                raise ConfigError(
                    f"group_size {self.config.group_size} > trainer batch_size {batch_size}: the "
                    "groups could never be batched; lower --env.group_size"
                )
            self.state.batch_size = batch_size
        if int(info.get("max_token_len", -1)) != -1:
            self.state.max_token_len = int(info["max_token_len"])
        if self.state.batch_size == -1:
            logger.warning("batch size unknown (trainer did not report it); off-policy limit off")

    async def setup_wandb(self) -> None:
        """Start a W&B run in the trainer's project/group (waits up to 60 s for them).

        Called after registration, when the trainer has normally published them already.
        """
        sink = find_sink(self.state.sinks, WandbSink)
        if sink is None:
            return
        project = group = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self.stop_event.is_set():
            try:
                info = await self.client.wandb_info()
            except (ApiUnavailableError, ApiRejectedError):
                info = {}
            project, group = info.get("project"), info.get("group")
            if project:
                break
            await self._sleep(1.0)
        if not project:
            logger.warning("trainer did not publish a W&B project; logging without one")
        sink.start(project=project, group=group)

    # ------------------------------------------------------------------ sending
    async def _post(self, group: dict[str, Any], key: str) -> None:
        env_id = self.env.env_id
        group["env_id"] = env_id
        try:
            await self.client.post_scored_data(group, idempotency_key=key)
        except ApiRejectedError as exc:
            if exc.status_code == 404 and not isinstance(exc, ApiBackpressureError):
                raise _NotRegistered(str(exc)) from exc
            raise

    async def send_group(
        self, group: dict[str, Any], deadline: float | None = None, key: str | None = None
    ) -> bool:
        """Post one group, surviving outages and re-registrations; True when the API took it.

        Transient failures (unreachable API, 5xx, 429) are retried with random exponential
        backoff up to 30 s per wait, indefinitely (or until ``deadline``); a 404 for our env_id
        triggers re-registration; other 4xx mean the group itself is invalid: logged, counted
        and dropped. Every attempt sends the same ``Idempotency-Key`` (``key``, default a new
        one), so a group whose reply was lost is stored once.
        """
        key = key or new_idempotency_key()
        stop = stop_after_delay(max(0.0, deadline - time.monotonic())) if deadline else (lambda _s: False)
        retrying = AsyncRetrying(
            retry=retry_if_exception_type((ApiUnavailableError, ApiBackpressureError, _NotRegistered)),
            wait=wait_random_exponential(multiplier=0.5, max=30),
            stop=stop,
            reraise=True,
            before_sleep=self._log_send_retry,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    try:
                        await self._post(group, key)
                    except _NotRegistered:
                        await self.reregister(group.get("env_id"))
                        raise
        except (ApiUnavailableError, ApiBackpressureError, _NotRegistered) as exc:
            logger.error("could not send a group before the deadline (%s)", exc)
            return False
        except ApiRejectedError as exc:
            self.env.stats["groups_rejected_by_api"] += 1
            logger.error("API rejected a group, dropping it: %s", exc)
            return True
        self.env.stats["groups_sent"] += 1
        self.state.items_sent_this_step += 1
        self.sent_since_status += 1
        return True

    def _log_send_retry(self, state: Any) -> None:
        exc = state.outcome.exception() if state.outcome else None
        self.env.stats["send_retries"] += 1
        logger.warning("sending a group failed (%s); %d unsent, retrying", exc, self.outbox.qsize() + 1)

    async def sender(self) -> None:
        """Drain the outbox forever, one group at a time, in order."""
        while True:
            group = await self.outbox.get()
            self.sending = group  # if cancelled mid-send, flush() sends it again (same key)
            self.sending_key = new_idempotency_key()
            try:
                await self.send_group(group, key=self.sending_key)
                self.sending = None
            finally:
                self.outbox.task_done()

    async def flush(self) -> int:
        """Send what is left in the outbox within ``flush_timeout``; return groups left unsent."""
        if self.sender_task is not None:
            self.sender_task.cancel()
            await asyncio.gather(self.sender_task, return_exceptions=True)
            self.sender_task = None
        pending = [(self.sending, self.sending_key)] if self.sending is not None else []
        self.sending = None
        while not self.outbox.empty():
            pending.append((self.outbox.get_nowait(), None))
        deadline = time.monotonic() + self.flush_timeout
        left = 0
        for group, key in pending:
            if time.monotonic() >= deadline or not await self.send_group(group, deadline, key):
                left += 1
        if left:
            self.env.stats["groups_unsent_at_shutdown"] += left
            logger.error("%d finished group(s) could not be sent before shutdown", left)
        return left

    # ------------------------------------------------------------------ workers
    async def _worker(self, item: Any) -> None:
        env = self.env
        # this task's own context: its groups carry the step of the weights they started with
        ROLLOUT_POLICY_VERSION.set(self.state.curr_step)
        try:
            outcome = await self._collect(item)
            if outcome.reason is not Skip.INFERENCE:
                self.recent_yields.append(len(outcome.groups))
            self.backlog.extend(outcome.backlog)
            if outcome.groups:
                await env.handle_send_to_api(outcome.groups, item)
        finally:
            try:
                await env.cleanup()
            except Exception:  # noqa: BLE001 - cleanup failures must not kill the worker loop
                logger.exception("cleanup() failed")

    async def _collect(self, item: Any) -> Any:
        """``run_item``, then serve's reaction to its outcome.

        Inference failures re-queue the item and back off; while every rollout fails (a bug or
        a misconfigured server) spawning backs off too; so it does while every rollout's groups
        are dropped as too long, invalid or of the wrong size (:meth:`_note_rejects`). A usable
        group resets all three.
        """
        outcome = await run_item(self.env, item)
        if outcome.reason is Skip.INFERENCE:
            self.backlog.appendleft(item)
            delay = self.inference_backoff
            self.inference_backoff = min(self.inference_backoff * 2, self.inference_backoff_max)
            self.inference_pause_until = time.monotonic() + delay
            logger.warning("item re-queued, pausing new rollouts %.1f s", delay)
        elif outcome.reason is Skip.ERROR:
            self.consecutive_errors += 1
            # 0.1 s, 0.2 s, ... up to 10 s between spawns instead of spinning; reset by a success.
            delay = spawn_backoff(self.consecutive_errors - 1)
            self.inference_pause_until = max(self.inference_pause_until, time.monotonic() + delay)
            if self.consecutive_errors > 1:
                logger.warning("%d rollout failures in a row", self.consecutive_errors)
        elif outcome.reason in _CONFIG_REJECTS:
            self.inference_backoff = 1.0
            self.consecutive_errors = 0
            self._note_rejects(outcome)
        elif outcome.reason is None:
            self.inference_backoff = 1.0
            self.consecutive_errors = 0
            self.consecutive_rejects = 0
            self.reject_reasons.clear()
        else:  # same scores / the env skipped the item: normal, neither slows nor resets
            self.inference_backoff = 1.0
            self.consecutive_errors = 0
        return outcome

    def _note_rejects(self, outcome: Any) -> None:
        """Count a rollout whose groups were all dropped as too_long / invalid / wrong_size.

        Such drops repeat for every item while the config is wrong (a trainer ``max_token_len``
        below the env's ``max_token_length``, an env that returns the wrong number of
        sequences), and respawning at once burns CPU for nothing. From the ``reject_streak``-th
        in a row, spawning pauses 0.1 s, 0.2 s, ... up to 10 s (like errors), and one warning
        per streak names the cause and the fix. Equal-score drops do not count.
        """
        self.consecutive_rejects += 1
        self.reject_reasons[outcome.reason] += 1
        beyond = self.consecutive_rejects - self.reject_streak
        if beyond < 0:
            return
        delay = spawn_backoff(beyond)
        self.inference_pause_until = max(self.inference_pause_until, time.monotonic() + delay)
        self.env.stats["reject_backoffs"] += 1
        if beyond == 0:
            logger.warning("%s", self._reject_advice(outcome))

    def _reject_advice(self, outcome: Any) -> str:
        counts = ", ".join(f"{n} {reason.value}" for reason, n in self.reject_reasons.most_common())
        example = outcome.dropped[0][1] if outcome.dropped else str(outcome.reason)
        head = (
            f"the last {self.consecutive_rejects} rollouts all had their groups dropped "
            f"({counts}; e.g. {example}); pausing new rollouts (up to 10 s) until one succeeds. "
        )
        main = self.reject_reasons.most_common(1)[0][0]
        if main is Skip.TOO_LONG:
            return head + (
                f"Sequences reach the trainer's max_token_len ({self.state.max_token_len}) while "
                f"the env generates up to max_token_length={self.config.max_token_length}: raise "
                "the trainer's max_token_len, or lower the env's --env.max_token_length (and the "
                "max_tokens it asks the server for)."
            )
        if main is Skip.WRONG_SIZE:
            return head + (
                f"Groups must have --env.group_size={self.config.group_size} sequences: return "
                "that many from collect_trajectories, or set group_overrides['group_size'] for "
                "variable-size groups."
            )
        return head + (
            "Groups must carry tokens, masks and scores with one row per sequence and matching "
            "row lengths: fix what collect_trajectories / score returns (check_env shows it)."
        )

    def _on_worker_done(self, task: asyncio.Task) -> None:
        self.workers.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.env.stats["worker_crashes"] += 1
            logger.error("worker crashed: %r", exc, exc_info=exc)
        self.wake.set()

    def worker_cap(self) -> int:
        """Groups allowed in flight now (max_num_workers, eval handling, off-policy room)."""
        env = self.env
        cap = env.max_num_workers
        if self.eval_task is not None and not self.eval_task.done():
            if self.config.eval_handling == EvalHandlingEnum.STOP_TRAIN:
                return 0
            if self.config.eval_handling == EvalHandlingEnum.LIMIT_TRAIN:
                cap = int(cap * self.config.eval_limit_ratio)
        if self.status:
            room = offpolicy_room(
                self.status,
                self.state.batch_size,
                self.config.group_size,
                self.config.max_batches_offpolicy,
                self.config.min_batch_allocation,
                unsent_groups=self.outbox.qsize() + self.sent_since_status,
            )
            if room is not None:  # rollouts count by how many groups they recently yielded
                cap = min(cap, inflight_cap(room, self.recent_yields))
        return cap

    async def spawn_workers(self) -> None:
        """Start rollouts until the cap is reached or no item is available."""
        if time.monotonic() < self.inference_pause_until:
            return
        cap = self.worker_cap()
        while len(self.workers) < cap and not self.stop_event.is_set():
            if self.backlog:
                item = self.backlog.popleft()
            else:
                item = await self.env.get_next_item()
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
        """Fetch ``/status-env`` (re-registering on 404) and react to step changes."""
        env = self.env
        try:
            status = await self.client.status_env(env.env_id)
        except ApiRejectedError as exc:
            if exc.status_code == 404:
                await self.reregister(env.env_id)
                return
            raise
        except ApiUnavailableError as exc:
            self.last_status_at = time.monotonic()
            if isinstance(exc.__cause__, httpx.TransportError):
                self.status_server_errors = 0
            else:
                # The API answers, but with 5xx: Atropos 0.4's API answers 500 (not 404) for an
                # env_id it forgot, so after several in a row, register again.
                self.status_server_errors += 1
                if self.status_server_errors >= STATUS_ERRORS_BEFORE_REREGISTER:
                    self.status_server_errors = 0
                    await self.reregister(env.env_id)
                    return
            logger.warning("cannot read /status-env (%s); continuing with the last status", exc)
            return
        self.status_server_errors = 0
        self.last_status_at = time.monotonic()
        self.sent_since_status = 0
        self.status = status
        self.state.status = status
        env.server.update_weight(float(status.get("env_weight", 1.0)))
        new_step = int(status.get("current_step", self.state.curr_step))
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
                await env.wandb_log({})
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
        total = self.state.total_steps
        if total <= 0 or not self.status:
            return False
        ahead = 0
        if self.state.batch_size > 0:
            ahead = int(self.status.get("queue_size", 0)) * self.config.group_size // self.state.batch_size
        return self.state.curr_step + ahead >= total

    def log_progress(self, every: float = 60.0) -> None:
        """Log a one-line summary (step, in flight, unsent, counters) at most every ``every`` s."""
        now = time.monotonic()
        if now - self.last_progress_log < every:
            return
        self.last_progress_log = now
        logger.info(
            "step %d: %d rollout group(s) in flight, %d unsent, backlog %d, API queue %s; %s",
            self.env.curr_step,
            len(self.workers),
            self.outbox.qsize(),
            len(self.backlog),
            self.status.get("queue_size", "?"),
            dict(self.env.stats),
        )

    # ------------------------------------------------------------------ main
    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stop_event.wait(), timeout=seconds)
        except TimeoutError:
            pass

    async def run(self) -> None:
        """Register, then loop until stopped or ``total_steps`` is reached; always clean up."""
        env = self.env
        try:
            await env.setup()
            await self.register(first=True)  # waits for the trainer, which publishes W&B info
            if self.stop_event.is_set():
                return
            await self.setup_wandb()
            await self.read_info()
            self.sender_task = asyncio.get_running_loop().create_task(self.sender())
            while not self.stop_event.is_set():
                if time.monotonic() - self.last_status_at >= self.status_interval:
                    await self.poll_status()
                    if self.reached_total_steps():
                        logger.info("total_steps=%d reached; finishing", self.state.total_steps)
                        self.finished = True
                        break
                await self.spawn_workers()
                self.reap_timeouts()
                self.log_progress()
                if self.sender_task.done() and not self.sender_task.cancelled():
                    exc = self.sender_task.exception()
                    if self.sending is not None:  # the group that broke the sender
                        self.sending = None
                        self.env.stats["groups_unsendable"] += 1
                    logger.error("sender stopped (%r); dropped the group it was sending, restarting", exc)
                    self.sender_task = asyncio.get_running_loop().create_task(self.sender())
                self.wake.clear()
                wait = max(0.05, self.status_interval - (time.monotonic() - self.last_status_at))
                if time.monotonic() < self.inference_pause_until:
                    wait = min(wait, self.inference_pause_until - time.monotonic() + 0.01)
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
            await self.flush()
            try:
                await self.client.disconnect_env(env.env_id)
                logger.info("disconnected env_id=%d from the API", env.env_id)
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                logger.warning("disconnect-env failed: %s", exc)
        elif self.sender_task is not None:
            self.sender_task.cancel()
        try:
            await env.wandb_log({})
        except Exception:  # noqa: BLE001
            logger.exception("final wandb_log failed")
        await close_sinks(self.state.sinks)
        await env.server.aclose()
        await self.client.aclose()
        logger.info("serve stopped; stats: %s", dict(env.stats))


__all__ = ["OUTBOX_MAX_GROUPS", "SERVE_STOP_EVENT", "ServeLoop", "offpolicy_room"]
