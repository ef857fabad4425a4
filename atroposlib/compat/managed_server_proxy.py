"""The ManagedServer OpenAI proxy under its Atropos 0.4 import path.

The proxy lives in :mod:`atroposlib.proxy`; this module re-exports its
public names, and ``python -m atroposlib.compat.managed_server_proxy`` runs the
same command as ``python -m atroposlib.proxy``. ``create_app`` is loaded on
first use, so importing this module (e.g. for the client) does not import FastAPI.
"""

from __future__ import annotations

from atroposlib.inference.clients.proxy_session import ProxyManagedServer, create_proxy_session
from atroposlib.proxy.errors import ProxyError, ProxyHTTPError
from atroposlib.proxy.models import (
    DEFAULT_MAX_SESSIONS,
    DEFAULT_SESSION_TTL_S,
    MAX_N,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ProxyConfig,
    ProxySettings,
    RenderResponse,
    SessionCreateRequest,
    SessionInfo,
    check_chat_message,
)
from atroposlib.proxy.run_proxy import build_parser, main
from atroposlib.proxy.state import ProxyState, Session

#: Atropos 0.4's names for our request/session types.
ChatCompletionProxyRequest = ChatCompletionRequest
SessionCreateResponse = SessionInfo
SessionState = Session


__all__ = [
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_SESSION_TTL_S",
    "MAX_N",
    "ChatCompletionProxyRequest",
    "ChatCompletionRequest",
    "ChatMessage",
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
    "SessionCreateResponse",
    "SessionInfo",
    "SessionState",
    "build_parser",
    "check_chat_message",
    "create_app",  # noqa: F822 - provided by __getattr__
    "create_proxy_session",
    "main",
    "openai_error",  # noqa: F822 - provided by __getattr__
]

if __name__ == "__main__":
    main()
