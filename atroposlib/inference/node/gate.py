"""The gate in front of a node's vLLM: lets completions through, or holds (and drains) them while an update is applied."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

logger = logging.getLogger("atroposlib.inference.node")

#: Seconds to wait for aborted completions to end after the drain timeout.
ABORT_GRACE_S = 30.0


class Gate:
    """Counts the completions in flight and holds new ones while it is closed.

    :class:`~atroposlib.inference.node.state.NodeState` closes it for an update, waits until
    the completions in flight are done (:meth:`wait_idle`), and opens it again. Its asyncio
    events are made on first use, inside the server's event loop.

    Attributes:
        in_flight: completions let through and not yet answered completely.
    """

    def __init__(self) -> None:
        self.in_flight = 0
        self._open: asyncio.Event | None = None  # set while completions may pass
        self._idle: asyncio.Event | None = None  # set while no completion is in flight

    def _events(self) -> tuple[asyncio.Event, asyncio.Event]:
        if self._open is None or self._idle is None:
            self._open, self._idle = asyncio.Event(), asyncio.Event()
            self._open.set()
            if self.in_flight == 0:
                self._idle.set()
        return self._open, self._idle

    async def wait_open(self) -> None:
        """Return once the gate is open (at once when it is); nothing is awaited after the check."""
        opened, _ = self._events()
        while not opened.is_set():
            await opened.wait()

    def enter(self) -> None:
        """Count one completion let through (call right after :meth:`wait_open`, with no await between)."""
        _, idle = self._events()
        self.in_flight += 1
        idle.clear()

    def leave(self) -> None:
        """One completion let through has been answered completely."""
        _, idle = self._events()
        self.in_flight -= 1
        if self.in_flight == 0:
            idle.set()

    def close(self) -> None:
        """Hold new completions until :meth:`open`."""
        self._events()[0].clear()

    def open(self) -> None:
        """Let completions through again."""
        self._events()[0].set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no completion is in flight; True when none is."""
        try:
            await asyncio.wait_for(self._events()[1].wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def close_and_drain(self, engine: Any, drain_timeout_s: float) -> float:
        """Close the gate, wait for the completions in flight, then pause vLLM.

        Completions still running after ``drain_timeout_s`` are aborted in vLLM (they get
        :data:`ABORT_GRACE_S` seconds to end). The gate stays closed: open it after the update.

        Args:
            engine: the node's vLLM engine calls (``pause(mode=...)``).
            drain_timeout_s: seconds the completions in flight may take (``--drain-timeout-s``).

        Returns:
            Seconds from closing the gate until vLLM was paused.
        """
        self.close()
        begin = time.perf_counter()
        if not await self.wait_idle(drain_timeout_s):
            logger.warning("%d completion(s) still running after %.0f s (--drain-timeout-s): "
                           "aborting them to apply the update", self.in_flight, drain_timeout_s)
            await engine.pause(mode="abort")
            await self.wait_idle(ABORT_GRACE_S)
        await engine.pause(mode="wait")
        return time.perf_counter() - begin


__all__ = ["ABORT_GRACE_S", "Gate"]
