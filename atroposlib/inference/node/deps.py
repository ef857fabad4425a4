"""FastAPI dependencies of the node's routes: how a route gets the node's state (``StateDep``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from atroposlib.inference.node.state import NodeState


def get_state(request: Request) -> NodeState:
    """Return the NodeState that :func:`atroposlib.inference.node.factory.build_app` attached."""
    return request.app.state.node


#: Route parameter type giving the handler the node's state.
StateDep = Annotated[NodeState, Depends(get_state)]
