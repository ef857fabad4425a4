"""The ManagedServer OpenAI proxy under its Atropos 0.4 import path.

The proxy lives in :mod:`atroposlib.envs.server_handling.proxy`; this module re-exports its
public names, and ``python -m atroposlib.envs.server_handling.managed_server_proxy`` runs the
same command as ``python -m atroposlib.envs.server_handling.proxy``. ``create_app`` is loaded on
first use, so importing this module (e.g. for the client) does not import FastAPI.
"""

from __future__ import annotations

from typing import Any

from atroposlib.envs.server_handling.proxy.cli import build_parser, main
from atroposlib.envs.server_handling.proxy.client import ProxyManagedServer, create_proxy_session
from atroposlib.envs.server_handling.proxy.errors import ProxyError, ProxyHTTPError
from atroposlib.envs.server_handling.proxy.models import (
    DEFAULT_MAX_SESSIONS,
    DEFAULT_SESSION_TTL_S,
    MAX_N,
    ChatCompletionRequest,
    CompletionRequest,
    ProxyConfig,
    ProxySettings,
    RenderResponse,
    SessionCreateRequest,
    SessionInfo,
    check_chat_message,
)
from atroposlib.envs.server_handling.proxy.state import ProxyState, Session


def __getattr__(name: str) -> Any:
    """Load ``create_app`` (which imports FastAPI) only when it is asked for."""
    if name == "create_app":
        from atroposlib.envs.server_handling.proxy.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_SESSION_TTL_S",
    "MAX_N",
    "ChatCompletionRequest",
    "CompletionRequest",
    "ProxyConfig",
    "ProxyError",
    "ProxyHTTPError",
    "ProxyManagedServer",
    "ProxySettings",
    "ProxyState",
    "RenderResponse",
    "Session",
    "SessionCreateRequest",
    "SessionInfo",
    "build_parser",
    "check_chat_message",
    "create_app",  # noqa: F822 - provided by __getattr__
    "create_proxy_session",
    "main",
]

if __name__ == "__main__":
    main()
