"""Health watch of the trainer's vLLM: notice a dead inference server in seconds, not at the next sync.

A daemon thread asks :meth:`~example_trainer.vllm_sync.VLLMSync.health_problem` every
``interval`` seconds. A launched vLLM that exited is dead at once (its exit code and the tail
of its log are in the message); an external server (``--vllm-url``) is dead once it has
failed its ``/health`` check for ``grace`` seconds in a row (a server restarting on purpose
may miss a few). Then the watch prints one line naming vLLM as dead and calls ``on_failure``
with a :class:`VLLMDiedError`; the trainer stops at its next check (at once while it waits for
a batch, else before the step's weight sync), writes a checkpoint of the last finished step
and records the error in ``summary.json``.

A weight sync that restarts vLLM on purpose runs inside :meth:`HealthWatch.paused`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from atroposlib.errors import InferenceError

#: Seconds between two health checks.
DEFAULT_INTERVAL_S = 1.0
#: Seconds an external vLLM may fail its /health check in a row before it is declared dead.
DEFAULT_GRACE_S = 10.0


class VLLMDiedError(InferenceError):
    """The trainer's vLLM exited (or stopped answering /health); the message says how."""


class HealthWatch:
    """Background check of one inference server.

    Args:
        probe: returns None while the server is healthy, else ``(why, final)``: ``final``
            True for a death that cannot heal (the launched process exited), False for a
            failed check that may pass again (counted against ``grace``).
        on_failure: called once, from the watch thread, with the :class:`VLLMDiedError`.
        interval: seconds between checks.
        grace: seconds of failed non-final checks in a row before the server is dead.
    """

    def __init__(self, probe: Callable[[], tuple[str, bool] | None],
                 on_failure: Callable[[VLLMDiedError], Any], interval: float = DEFAULT_INTERVAL_S,
                 grace: float = DEFAULT_GRACE_S):
        """Describe the watch; nothing runs until :meth:`start`."""
        self.probe = probe
        self.on_failure = on_failure
        self.interval = interval
        self.grace = grace
        #: the error once the server was found dead (None: alive so far)
        self.failure: VLLMDiedError | None = None
        self._stop = threading.Event()
        self._pause = threading.Lock()  # held by paused(); the watch skips checks meanwhile
        self._thread: threading.Thread | None = None

    def start(self) -> HealthWatch:
        """Start checking in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self._run, name="vllm-health", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop checking (before the server is stopped on purpose); idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)
            self._thread = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No check runs inside this block (a sync that restarts the server)."""
        with self._pause:
            yield

    def check_once(self, failing_since: float | None = None) -> float | None:
        """Run one check; return when the current run of failed checks began (None: healthy).

        Calls :meth:`_fail` when the server is dead (a final problem, or failing for
        ``grace`` seconds).
        """
        with self._pause:
            try:
                problem = self.probe()
            except Exception as exc:  # noqa: BLE001 - a probe that raises is a failed check
                problem = (f"its health check failed: {type(exc).__name__}: {exc}", False)
        if problem is None:
            return None
        why, final = problem
        now = time.monotonic()
        since = failing_since if failing_since is not None else now
        if final or now - since >= self.grace:
            self._fail(why)
        return since

    def _run(self) -> None:
        failing_since: float | None = None
        while not self._stop.wait(self.interval) and self.failure is None:
            failing_since = self.check_once(failing_since)

    def _fail(self, why: str) -> None:
        self.failure = VLLMDiedError(f"vLLM died: {why}")
        print(f"[grpo] error: {self.failure}", flush=True)
        self.on_failure(self.failure)
