"""Run-time state of one proxy app: its backends, the shared tokenizer and the open sessions.

A session owns one ``ManagedServer`` (entered through ``ServerManager.managed_server()``);
sessions idle longer than the TTL are swept, and a recently expired uuid is remembered so a
late request learns that it expired rather than that it never existed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from atroposlib.inference.clients.manager import ServerManager
from atroposlib.proxy.errors import ProxyHTTPError
from atroposlib.proxy.models import ProxyConfig, ProxySettings, SessionInfo
from atroposlib.utils.hf_tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


@dataclass
class Session:
    """One open session: a ``ManagedServer`` plus bookkeeping."""

    uuid: str
    managed: Any
    exit_stack: contextlib.AsyncExitStack
    tool_parser: str | None
    base_url: str | None
    track_tree: bool
    created_at: float
    last_used_at: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def nodes(self) -> list[Any]:
        """Tracked nodes (tree mode: every sequence)."""
        state = self.managed.get_state()
        if "nodes" in state:
            return list(state["nodes"])
        return list(state["sequences"].values())


class ProxyState:
    """Backends, tokenizer and sessions of one proxy app."""

    def __init__(self, config: ProxyConfig | None, settings: ProxySettings):
        """Create the state; backends are built lazily (``ensure_backends``)."""
        self.config = config
        self.settings = settings
        self.manager: Any = None
        self.tokenizer: Any = None
        self.sessions: dict[str, Session] = {}
        #: uuids that expired recently, so a late request gets "expired" instead of "unknown".
        self.expired: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.setup_lock = asyncio.Lock()

    async def ensure_backends(self) -> None:
        """Build the ``ServerManager`` and load the tokenizer if not done yet.

        Raises:
            ProxyHTTPError: 503 when no backends are configured.
        """
        if self.manager is not None:
            return
        if self.config is None:
            raise ProxyHTTPError(
                503,
                "the proxy has no inference backends; POST /setup with "
                '{"model_name": ..., "servers": [{"base_url": ..., "server_type": "vllm"}]} '
                "or start it with --config servers.json",
                "server_error",
                "not_configured",
            )
        async with self.setup_lock:
            if self.manager is not None:
                return
            self.tokenizer, self.manager = await self.build_backends(self.config)

    async def build_backends(self, config: ProxyConfig) -> tuple[Any, Any]:
        """Load ``config``'s tokenizer and build its ``ServerManager``; changes no state.

        Returns:
            ``(tokenizer, manager)``, every backend sharing the one tokenizer.

        Raises:
            ProxyHTTPError: 503 when the tokenizer cannot be loaded or the backends cannot be
                built.
        """
        tokenizer_name = config.tokenizer

        try:
            tokenizer = await asyncio.to_thread(load_tokenizer, tokenizer_name)
        except Exception as exc:  # noqa: BLE001 - reported with the fix
            raise ProxyHTTPError(
                503,
                f"cannot load tokenizer {tokenizer_name!r}: {exc}; set tokenizer_name in the "
                "proxy config to a local tokenizer directory or an available HF name",
                "server_error",
                "tokenizer_unavailable",
            ) from exc
        try:
            manager = ServerManager(list(config.servers))
        except Exception as exc:  # noqa: BLE001 - reported with the fix
            raise ProxyHTTPError(
                503, f"cannot build the inference backends: {type(exc).__name__}: {exc}",
                "server_error", "backends_unavailable",
            ) from exc
        for server in manager.servers:
            server._tokenizer = tokenizer  # one tokenizer for all backends (no reloads)
        return tokenizer, manager

    async def close_sessions(self) -> int:
        """Delete every session; return how many there were."""
        count = len(self.sessions)
        for session_id in list(self.sessions):
            await self.drop(session_id)
        return count

    async def drop(self, session_id: str, expired: bool = False) -> bool:
        """Delete one session (reset its tracker); return False if it did not exist."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return False
        if expired:
            self.expired[session_id] = time.time()
            while len(self.expired) > 4 * self.settings.max_sessions:
                self.expired.popitem(last=False)
        await session.exit_stack.aclose()
        return True

    async def sweep(self) -> int:
        """Delete sessions idle longer than the TTL (not those with a request in flight)."""
        now = time.time()
        stale = [
            sid
            for sid, s in self.sessions.items()
            if now - s.last_used_at > self.settings.session_ttl_s and not s.lock.locked()
        ]
        for sid in stale:
            logger.info("session %s expired after %.0f s idle", sid, self.settings.session_ttl_s)
            await self.drop(sid, expired=True)
        return len(stale)

    async def get(self, session_id: str) -> Session:
        """Return a live session and mark it used.

        Raises:
            ProxyHTTPError: 404 for an unknown or expired uuid.
        """
        await self.sweep()
        session = self.sessions.get(session_id)
        if session is None:
            if session_id in self.expired:
                raise ProxyHTTPError(
                    404,
                    f"session {session_id} expired after {self.settings.session_ttl_s:g} s idle; "
                    "create a new one with POST /sessions/create (or start the proxy with a "
                    "larger --session-ttl)",
                    "not_found_error",
                    "session_expired",
                )
            raise ProxyHTTPError(
                404,
                f"unknown session {session_id}; create one with POST /sessions/create",
                "not_found_error",
                "session_not_found",
            )
        session.last_used_at = time.time()
        return session

    def info(self, session: Session) -> SessionInfo:
        """Describe a session."""
        return SessionInfo(
            uuid=session.uuid,
            model_name=self.config.model_name if self.config else "",
            tool_parser=session.tool_parser,
            base_url=session.base_url,
            track_tree=session.track_tree,
            created_at=session.created_at,
            last_used_at=session.last_used_at,
            expires_at=session.last_used_at + self.settings.session_ttl_s,
            num_nodes=len(session.nodes()),
        )

