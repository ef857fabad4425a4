"""Session routes.

``POST /sessions/create``, ``GET /sessions``, ``GET /{uuid}/nodes``, ``DELETE /{uuid}``.
"""

from __future__ import annotations

import contextlib
import time
import uuid as uuid_lib
from typing import Any

from fastapi import APIRouter

from atroposlib.proxy.deps import ProxyStateDep
from atroposlib.proxy.errors import ProxyHTTPError
from atroposlib.proxy.models import SessionCreateRequest, SessionInfo
from atroposlib.proxy.state import Session

router = APIRouter(tags=["sessions"])


@router.post("/sessions/create")
async def create_session(state: ProxyStateDep,
                         body: SessionCreateRequest | None = None) -> SessionInfo:
    """Open a session (404 unknown ``base_url``, 429 when ``max_sessions`` are open)."""
    body = body or SessionCreateRequest()
    await state.ensure_backends()
    await state.sweep()
    if len(state.sessions) >= state.settings.max_sessions:
        raise ProxyHTTPError(
            429,
            f"too many open sessions ({len(state.sessions)} of max_sessions="
            f"{state.settings.max_sessions}); DELETE /{{uuid}} sessions you are done with, "
            "wait for idle ones to expire, or restart the proxy with a larger --max-sessions",
            "rate_limit_error",
            "too_many_sessions",
        )
    stack = contextlib.AsyncExitStack()
    try:
        managed = await stack.enter_async_context(
            state.manager.managed_server(
                tokenizer=state.tokenizer,
                base_url=body.base_url,
                preserve_think_blocks=body.preserve_think_blocks,
                track_tree=body.track_tree,
                tool_parser=body.tool_parser,
            )
        )
    except ValueError as exc:
        raise ProxyHTTPError(404, f"{exc}; omit base_url to use the least busy backend",
                             "not_found_error", "server_not_found") from exc
    except NotImplementedError as exc:
        raise ProxyHTTPError(400, str(exc), "invalid_request_error",
                             "backend_unsupported") from exc
    now = time.time()
    session = Session(
        uuid=str(uuid_lib.uuid4()),
        managed=managed,
        exit_stack=stack,
        tool_parser=body.tool_parser,
        base_url=getattr(managed.server.config, "base_url", None),
        track_tree=body.track_tree,
        created_at=now,
        last_used_at=now,
    )
    state.sessions[session.uuid] = session
    return state.info(session)


@router.get("/sessions")
async def list_sessions(state: ProxyStateDep) -> dict[str, Any]:
    """``{"sessions": [SessionInfo, ...]}`` (expired ones are swept first)."""
    await state.sweep()
    return {"sessions": [state.info(s).model_dump() for s in state.sessions.values()]}


@router.get("/{session_id}/nodes")
async def nodes(session_id: str, state: ProxyStateDep) -> dict[str, Any]:
    """``{"nodes": [{full_text, tokens, masked_tokens, logprobs, metadata}, ...]}``.

    Tree sessions also get ``"tree": {full_text: parent_full_text | None}``.
    """
    session = await state.get(session_id)
    out: dict[str, Any] = {"nodes": [n.model_dump() for n in session.nodes()]}
    if session.track_tree:
        out["tree"] = session.managed.get_state()["tree"]
    return out


@router.delete("/{session_id}")
async def delete_session(session_id: str, state: ProxyStateDep) -> dict[str, Any]:
    """Delete a session (404 if unknown).

    Returns ``{"status": "deleted", "uuid": ..., "deleted": true}`` (Atropos 0.4's reply, which
    clients check with ``["status"] == "deleted"``, plus the boolean).
    """
    await state.get(session_id)
    await state.drop(session_id)
    return {"status": "deleted", "uuid": session_id, "deleted": True}
