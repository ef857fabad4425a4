"""Health gating of an inference client: a cheap background probe, a bounded wait before requests.

:class:`HealthGate` is the health half of
:class:`~atroposlib.inference.clients.base.InferenceClient`: a background task probes the server
(``_check_health``, never a paid completion) every :data:`HEALTH_INTERVAL_HEALTHY` seconds while
it is healthy and every :data:`HEALTH_INTERVAL_UNHEALTHY` seconds while it is not; a request
waits for health at most ``config.timeout`` seconds, then raises
:class:`~atroposlib.errors.InferenceUnavailableError`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from atroposlib.errors import InferenceUnavailableError

logger = logging.getLogger(__name__)

#: Seconds between background health checks while a server is healthy / unhealthy.
HEALTH_INTERVAL_HEALTHY = 10.0
HEALTH_INTERVAL_UNHEALTHY = 1.0
#: A health probe that takes longer than this (seconds) has timed out.
HEALTH_PROBE_TIMEOUT = 10.0
#: Timed-out probes in a row after which a healthy server is marked unhealthy. A server busy
#: with a burst of requests on a saturated CPU can answer one probe late; one that is down
#: refuses the connection, which counts at once.
HEALTH_PROBE_TIMEOUTS_TO_FAIL = 2


def is_connection_error(exc: BaseException) -> bool:
    """True for a failure to reach the server at all (the server is then marked unhealthy)."""
    import httpx

    if isinstance(exc, (httpx.TransportError, ConnectionError)):
        return True
    try:
        import openai
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, openai.APIConnectionError)


class HealthGate:
    """Health state and gating of one inference endpoint (a mixin of ``InferenceClient``).

    It reads ``config`` (``health_check``, ``base_url``, ``timeout``) and ``name``, keeps
    ``server_healthy`` up to date, and runs the background probe once a request needs it.
    :meth:`_init_health_gate` sets its state (``InferenceClient.__init__`` calls it).
    """

    config: Any
    name: str

    def _init_health_gate(self) -> None:
        """Start healthy unless health checks are on (then the first probe decides)."""
        self.server_healthy = not self._health_checks_enabled()
        self._health_task: asyncio.Task | None = None
        self._closing = False
        self._healthy_event: asyncio.Event | None = None
        self._probe_timeouts = 0  # timed-out probes in a row

    def _health_checks_enabled(self) -> bool:
        return bool(getattr(self.config, "health_check", False)) and bool(
            getattr(self.config, "base_url", None)
        )

    async def _check_health(self) -> bool:
        """Backend-specific health probe; must be cheap (no paid completions). Default: True."""
        return True

    async def check_health(self) -> bool:
        """Probe the server now, update ``server_healthy`` and return it.

        Never raises: any exception from the probe counts as unhealthy; so does no answer
        within ``HEALTH_PROBE_TIMEOUT`` seconds, for a healthy server only from the
        ``HEALTH_PROBE_TIMEOUTS_TO_FAIL``-th such probe in a row (a busy server answers late;
        the background loop then probes again after ``HEALTH_INTERVAL_UNHEALTHY`` seconds).
        """
        try:
            healthy = bool(await asyncio.wait_for(self._check_health(), HEALTH_PROBE_TIMEOUT))
            self._probe_timeouts = 0
        except TimeoutError:
            self._probe_timeouts += 1
            logger.debug("health probe of %s timed out (%d in a row)", self.name, self._probe_timeouts)
            healthy = self.server_healthy and self._probe_timeouts < HEALTH_PROBE_TIMEOUTS_TO_FAIL
        except Exception as exc:  # noqa: BLE001 - a failing probe simply means "unhealthy"
            logger.debug("health check of %s failed: %r", self.name, exc)
            self._probe_timeouts = 0
            healthy = False
        self._set_healthy(healthy)
        return healthy

    def _set_healthy(self, healthy: bool) -> None:
        if healthy != self.server_healthy:
            logger.log(
                logging.INFO if healthy else logging.WARNING,
                "inference server %s is now %s",
                self.name,
                "healthy" if healthy else "UNHEALTHY",
            )
        self.server_healthy = healthy
        if self._healthy_event is not None:
            if healthy:
                self._healthy_event.set()
            else:
                self._healthy_event.clear()

    def start_health_checks(self) -> None:
        """Start the background probe now, if health checks are on (idempotent).

        A server is otherwise probed only once a request is sent to it, so one that no request
        has picked yet stays unhealthy and is never picked while another is healthy. Call it
        from inside the event loop.
        """
        self._ensure_health_task()

    def _ensure_health_task(self) -> None:
        if self._healthy_event is None:
            self._healthy_event = asyncio.Event()
            if self.server_healthy:
                self._healthy_event.set()
        if not self._health_checks_enabled():
            return
        if self._health_task is None or self._health_task.done():
            self._health_task = asyncio.get_running_loop().create_task(
                self._health_loop(), name=f"health:{self.name}"
            )

    async def _health_loop(self) -> None:
        while not self._closing:
            healthy = await self.check_health()
            if self._closing:
                return
            recheck = not healthy or self._probe_timeouts > 0
            await asyncio.sleep(HEALTH_INTERVAL_UNHEALTHY if recheck else HEALTH_INTERVAL_HEALTHY)

    async def wait_until_healthy(self, timeout: float | None = None) -> None:
        """Wait until the server is healthy.

        Args:
            timeout: seconds to wait; defaults to ``config.timeout``.

        Raises:
            InferenceUnavailableError: still unhealthy after ``timeout`` seconds.
        """
        self._ensure_health_task()
        if self.server_healthy:
            return
        timeout = self.config.timeout if timeout is None else timeout
        assert self._healthy_event is not None
        try:
            await asyncio.wait_for(self._healthy_event.wait(), timeout)
        except TimeoutError:
            raise InferenceUnavailableError(
                f"inference server {self.name} stayed unhealthy for {timeout:.0f} s; check that "
                "it is running and that base_url is right (or set health_check=False)"
            ) from None

    async def aclose(self) -> None:
        """Stop the background health task (subclasses also close their HTTP clients)."""
        task, self._health_task = self._health_task, None
        if task is None:
            return
        self._closing = True
        # On Python 3.11 a cancel that lands while asyncio.wait_for's probe finishes is swallowed
        # (CPython gh-86296): the loop then sleeps on and a plain `await task` hangs forever.
        # So cancel again until it is done; the closing flag stops the loop at its next check.
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
        if not task.cancelled() and task.exception() is not None:
            logger.debug("health task of %s ended with %r", self.name, task.exception())
        self._closing = False

    def note_request_error(self, exc: BaseException) -> None:
        """After a failed request: a connection error marks the server unhealthy (re-probed)."""
        if is_connection_error(exc) and self._health_checks_enabled():
            self._set_healthy(False)
            self._ensure_health_task()


__all__ = [
    "HEALTH_INTERVAL_HEALTHY",
    "HEALTH_INTERVAL_UNHEALTHY",
    "HEALTH_PROBE_TIMEOUT",
    "HEALTH_PROBE_TIMEOUTS_TO_FAIL",
    "HealthGate",
    "is_connection_error",
]
