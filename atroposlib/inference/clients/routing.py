"""Choose the inference server a request goes to: healthy, on the newest policy version, least busy."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from atroposlib.inference.clients.base import InferenceClient

#: the manager's logger: routing messages read as the server manager's
logger = logging.getLogger("atroposlib.inference.clients.manager")

#: Seconds between two health probes of a server routed around for serving an old policy version.
LAGGING_PROBE_S = 1.0


class ServerPicker:
    """Picks one server per request for a :class:`~atroposlib.inference.clients.manager.ServerManager`.

    Remembers the servers it routes around for serving an old policy version (and when each
    was last probed), so it logs once when one falls behind and once when it rejoins.
    """

    def __init__(self) -> None:
        self._lagging: dict[str, float] = {}  # server routed around -> time of its last probe
        self._probes: set[asyncio.Task] = set()

    def pick(self, servers: list[InferenceClient], split: str = "train") -> InferenceClient:
        """Return the healthy, current server with the most free slots.

        Current: among servers that report a policy version (inference nodes), only those
        serving the newest version any of them reported; a node that missed a weight sync is
        routed around until it serves that version (:meth:`current`). Falls back to every
        healthy server, then to every server, rather than having none. Each server's health
        probe runs from the first pick on, so a server no request has gone to yet is known
        healthy when the one serving so far dies.

        Args:
            servers: the candidates (not empty).
            split: ``train`` or ``eval``: whose semaphore's free slots count.

        Returns:
            The chosen server; ties go to the one with fewer requests in flight, then the first.
        """
        for server in servers:  # every server gets probed, not only those requests went to
            start = getattr(server, "start_health_checks", None)
            if start is not None:
                start()
        healthy = [s for s in servers if s.server_healthy]
        pool = self.current(healthy) or healthy or servers
        sem_of = (lambda s: s.sem) if split == "train" else (lambda s: s.eval_sem)
        # servers built outside InferenceClient (test doubles) may not count requests in flight
        return max(pool, key=lambda s: (sem_of(s).free_slots(), -getattr(s, "in_flight", 0)))

    def current(self, servers: list[InferenceClient]) -> list[InferenceClient]:
        """The servers not behind the newest policy version reported among ``servers``.

        A server lagging behind gets a health probe (which reads its version) at most every
        :data:`LAGGING_PROBE_S` seconds while it is routed around, so it rejoins about as soon
        as the trainer's weights reach it.
        """
        versions = [v for s in servers if (v := getattr(s, "policy_version", None)) is not None]
        if not versions:
            return servers
        newest = max(versions)
        current = []
        for server in servers:
            version = getattr(server, "policy_version", None)
            if version is None or version >= newest:
                current.append(server)
                if self._lagging.pop(server.name, None) is not None:
                    logger.info("inference server %s serves policy version %d again: routing to it",
                                server.name, version)
                continue
            now = time.monotonic()
            if server.name not in self._lagging:
                logger.warning("inference server %s serves policy version %d while others serve "
                               "%d: routing around it until it has the new weights", server.name,
                               version, newest)
                self._lagging[server.name] = 0.0
            if now - self._lagging[server.name] > LAGGING_PROBE_S and hasattr(server, "check_health"):
                self._lagging[server.name] = now
                task = asyncio.get_running_loop().create_task(server.check_health())
                self._probes.add(task)
                task.add_done_callback(self._probes.discard)
        return current


__all__ = ["LAGGING_PROBE_S", "ServerPicker"]
