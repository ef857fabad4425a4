"""FastAPI dependencies: how a route gets the app's ApiState (``StateDep``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from atroposlib.api.state import ApiState


def get_state(request: Request) -> ApiState:
    """Return the ApiState that :func:`atroposlib.api.factory.build_app` attached to the app."""
    return request.app.state.api


#: Route parameter type giving the handler the app's state.
StateDep = Annotated[ApiState, Depends(get_state)]
