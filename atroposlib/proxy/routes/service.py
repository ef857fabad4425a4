"""Service routes: ``GET /health``, ``GET /v1/models``, ``POST /setup``, ``GET /servers``."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from pydantic import ValidationError

from atroposlib.proxy.deps import ProxyStateDep
from atroposlib.proxy.errors import ProxyHTTPError, validation_message
from atroposlib.proxy.models import ProxyConfig

router = APIRouter(tags=["service"])


def server_row(server: Any) -> dict[str, Any]:
    """``{base_url, server_type, model_name, healthy}`` of one built backend."""
    config = server.config
    return {
        "base_url": getattr(config, "base_url", None),
        "server_type": config.server_type,
        "model_name": config.model_name,
        "healthy": bool(server.server_healthy),
    }


@router.get("/health")
async def health(state: ProxyStateDep) -> dict[str, Any]:
    """``{status, model, sessions, servers, healthy_servers}`` (servers probed now)."""
    servers = state.manager.servers if state.manager is not None else []
    healthy = await asyncio.gather(*(s.check_health() for s in servers))
    return {
        "status": "ok" if state.config is not None else "not_configured",
        "model": state.config.model_name if state.config else None,
        "sessions": len(state.sessions),
        "servers": len(state.config.servers) if state.config else 0,
        "healthy_servers": sum(bool(h) for h in healthy),
    }


@router.get("/v1/models")
async def models(state: ProxyStateDep) -> dict[str, Any]:
    """OpenAI model list with the one served model."""
    data = []
    if state.config is not None:
        data.append({"id": state.config.model_name, "object": "model",
                     "created": 0, "owned_by": "atroposlib"})
    return {"object": "list", "data": data}


@router.post("/setup")
async def setup(body: dict[str, Any], state: ProxyStateDep) -> dict[str, Any]:
    """Replace the backends; every open session is deleted (it used the old ones).

    The new backends are built before anything changes: a config whose tokenizer or
    backends cannot be built is a 400 and the previous configuration stays active.
    """
    try:
        config = ProxyConfig.model_validate(body)
    except ValidationError as exc:
        raise ProxyHTTPError(400, f"invalid proxy config: {validation_message(exc)}",
                             "invalid_request_error", "invalid_config") from exc
    async with state.setup_lock:
        # Build the new backends first: a failure leaves the working configuration (and
        # its sessions) in place.
        try:
            tokenizer, manager = await state.build_backends(config)
        except ProxyHTTPError as exc:
            raise ProxyHTTPError(
                400, f"{exc.message}. The previous configuration is still active.",
                "invalid_request_error", exc.code,
            ) from exc
        dropped = await state.close_sessions()
        old = state.manager
        state.config, state.tokenizer, state.manager = config, tokenizer, manager
    if old is not None:
        await old.aclose()
    return {"status": "ok", "model": config.model_name, "servers": len(config.servers),
            "dropped_sessions": dropped}


@router.get("/servers")
async def servers(state: ProxyStateDep) -> dict[str, Any]:
    """The backends, each with ``base_url``, ``server_type``, ``model_name``, ``healthy``."""
    if state.manager is None:
        rows = [
            {"base_url": c.base_url, "server_type": c.server_type,
             "model_name": c.model_name, "healthy": None}
            for c in (state.config.servers if state.config else [])
        ]
        return {"servers": rows}
    await asyncio.gather(*(s.check_health() for s in state.manager.servers))
    return {"servers": [server_row(s) for s in state.manager.servers]}
