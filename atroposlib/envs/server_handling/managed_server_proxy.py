"""The ManagedServer OpenAI proxy under its Atropos 0.4 import path.

The proxy lives in :mod:`atroposlib.envs.server_handling.proxy`; this module re-exports its
public names, and ``python -m atroposlib.envs.server_handling.managed_server_proxy`` runs the
same command as ``python -m atroposlib.envs.server_handling.proxy``. ``create_app`` is loaded on
first use, so importing this module (e.g. for the client) does not import FastAPI.
"""

from __future__ import annotations

from atroposlib.envs.server_handling.proxy.cli import build_parser, main
from atroposlib.envs.server_handling.proxy.client import ProxyManagedServer, create_proxy_session
from atroposlib.envs.server_handling.proxy.errors import ProxyError, ProxyHTTPError
from atroposlib.envs.server_handling.proxy.models import (
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
from atroposlib.envs.server_handling.proxy.state import ProxyState, Session
from atroposlib.utils.lazy_exports import lazy_exports

#: Atropos 0.4's names for our request/session types.
ChatCompletionProxyRequest = ChatCompletionRequest
SessionCreateResponse = SessionInfo
SessionState = Session

_SH = "atroposlib.envs.server_handling."
# FastAPI-side names (and the classes Atropos 0.4's module imported) load on first use, so
# importing this module (e.g. for the client) does not import FastAPI.
__getattr__ = lazy_exports(__name__, {
    "create_app": _SH + "proxy.app",
    "openai_error": _SH + "proxy.app",
    "APIServerConfig": _SH + "server_baseline",
    "BaseModel": "pydantic",
    "DummyManagedServer": _SH + "managed_server",
    "ManagedServer": _SH + "managed_server",
    "OpenAIServer": _SH + "openai_server",
    "ServerManager": _SH + "server_manager",
    "ToolCallTranslator": _SH + "tool_call_translator",
    "FastAPI": "fastapi",
    "HTTPException": "fastapi",
    "Request": "fastapi",
    "JSONResponse": "fastapi.responses",
})


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
