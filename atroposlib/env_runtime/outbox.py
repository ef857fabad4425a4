"""Serve mode's outbox: finished groups wait here and one sender posts them, in order.

The outbox is bounded (:data:`OUTBOX_MAX_GROUPS`; workers wait when it is full) and survives
API outages: one sender task posts groups with retries and random exponential backoff (gzip
via the client), re-registers when the API has forgotten this env (404, e.g. after a restart)
and resends. Every post of one group carries the same ``Idempotency-Key``, so a retry after a
lost reply is stored once. At shutdown :meth:`Outbox.flush` sends what is left, bounded in time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from atroposlib.api.client import new_idempotency_key
from atroposlib.envs.drops import attach_drops
from atroposlib.errors import ApiBackpressureError, ApiRejectedError, ApiUnavailableError

if TYPE_CHECKING:
    from atroposlib.env_runtime.api_session import ApiSession

logger = logging.getLogger(__name__)

#: Finished groups kept locally while the API is unreachable; workers wait when it is full.
OUTBOX_MAX_GROUPS = 256


class _NotRegistered(Exception):
    """The API does not know our env_id any more (404); re-register and retry."""


class Outbox:
    """The queue of finished groups and the one task that sends them (see module docstring)."""

    def __init__(self, session: ApiSession, queue: asyncio.Queue, flush_timeout: float = 30.0):
        """Wrap ``queue`` (the env's outbox sink queue); nothing is sent until :meth:`start`.

        Args:
            session: the API session (client, registration) to post through.
            queue: where the env's ``handle_send_to_api`` puts finished groups.
            flush_timeout: seconds allowed at shutdown to send unsent groups.
        """
        self.session = session
        self.env = session.env
        self.queue = queue
        self.flush_timeout = flush_timeout
        self.sender_task: asyncio.Task | None = None
        self.sending: dict[str, Any] | None = None
        self.sending_key: str | None = None  # the Idempotency-Key of `sending`
        self.sent_since_status = 0  # groups sent since the last /status-env (not counted there yet)

    def _drops(self) -> Any:
        """The env's :class:`~atroposlib.envs.drops.DropTally` (None for an env without one)."""
        return getattr(getattr(self.env, "run_state", None), "drops", None)

    def unsent(self) -> int:
        """Groups finished but not yet counted by the API's last status."""
        return self.queue.qsize() + self.sent_since_status

    async def _post(self, group: dict[str, Any], key: str) -> None:
        env_id = self.env.env_id
        group["env_id"] = env_id
        try:
            await self.session.client.post_scored_data(group, idempotency_key=key)
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
                        await self.session.reregister(group.get("env_id"))
                        raise
        except (ApiUnavailableError, ApiBackpressureError, _NotRegistered) as exc:
            logger.error("could not send a group before the deadline (%s)", exc)
            return False
        except ApiRejectedError as exc:
            self.env.stats["groups_rejected_by_api"] += 1
            logger.error("API rejected a group, dropping it: %s", exc)
            return True
        self.env.stats["groups_sent"] += 1
        self.session.state.items_sent_this_step += 1
        self.sent_since_status += 1
        return True

    def _log_send_retry(self, state: Any) -> None:
        exc = state.outcome.exception() if state.outcome else None
        self.env.stats["send_retries"] += 1
        logger.warning("sending a group failed (%s); %d unsent, retrying", exc, self.queue.qsize() + 1)

    async def sender(self) -> None:
        """Drain the outbox forever, one group at a time, in order."""
        while True:
            group = await self.queue.get()
            # the env's dropped groups since the last one ride on this group (same body, same key
            # on every retry: counted once by run-api's ledger)
            attach_drops(group, self._drops())
            self.sending = group  # if cancelled mid-send, flush() sends it again (same key)
            self.sending_key = new_idempotency_key()
            try:
                await self.send_group(group, key=self.sending_key)
                self.sending = None
            finally:
                self.queue.task_done()

    def start(self) -> None:
        """Start the sender task."""
        self.sender_task = asyncio.get_running_loop().create_task(self.sender())

    def restart_if_broken(self) -> None:
        """If the sender died (a group broke it), drop that group, count it and start again."""
        task = self.sender_task
        if task is None or not task.done() or task.cancelled():
            return
        exc = task.exception()
        if self.sending is not None:  # the group that broke the sender
            self.sending = None
            self.env.stats["groups_unsendable"] += 1
        logger.error("sender stopped (%r); dropped the group it was sending, restarting", exc)
        self.start()

    async def stop(self) -> None:
        """Cancel the sender task (the group it was sending stays in :attr:`sending`)."""
        if self.sender_task is not None:
            self.sender_task.cancel()
            await asyncio.gather(self.sender_task, return_exceptions=True)
            self.sender_task = None

    async def flush(self) -> int:
        """Send what is left in the outbox within ``flush_timeout``; return groups left unsent."""
        await self.stop()
        pending = [(self.sending, self.sending_key)] if self.sending is not None else []
        self.sending = None
        while not self.queue.empty():
            pending.append((self.queue.get_nowait(), None))
        deadline = time.monotonic() + self.flush_timeout
        left = 0
        for group, key in pending:
            if key is None:  # never posted yet (a posted body must not change: same key)
                attach_drops(group, self._drops())
            if time.monotonic() >= deadline or not await self.send_group(group, deadline, key):
                left += 1
        if left:
            self.env.stats["groups_unsent_at_shutdown"] += left
            logger.error("%d finished group(s) could not be sent before shutdown", left)
        return left


__all__ = ["OUTBOX_MAX_GROUPS", "Outbox"]
