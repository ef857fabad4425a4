"""FastAPI dependency: how a route gets its app's :class:`ProxyState` (``ProxyStateDep``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from atroposlib.proxy.state import ProxyState


def get_state(request: Request) -> ProxyState:
    """Return the ProxyState that ``create_app`` attached to the app (``app.state.proxy``)."""
    return request.app.state.proxy


#: Route parameter type giving the handler the app's proxy state.
ProxyStateDep = Annotated[ProxyState, Depends(get_state)]
