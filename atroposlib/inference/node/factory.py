"""build_app(): the FastAPI application of the node's own routes (status, weights, nccl).

It runs inside vLLM's server: :class:`~atroposlib.inference.node.middleware.NodeMiddleware`
hands it every request under ``/atropos/``.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from atroposlib import __version__
from atroposlib.inference.node.payload import PayloadError
from atroposlib.inference.node.routes import nccl, status, weights
from atroposlib.inference.node.state import DeltaRefused, NodeState, UpdateFailed


async def _payload_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, PayloadError)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)


async def _update_failed(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, UpdateFailed)
    return JSONResponse({"detail": exc.detail}, status_code=500)


async def _delta_refused(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DeltaRefused)
    return JSONResponse({"detail": exc.detail, "reason": exc.reason}, status_code=409)


def build_app(state: NodeState) -> FastAPI:
    """Create the node's application around ``state``.

    Args:
        state: the node's state; routes reach it as ``app.state.node``.

    Returns:
        The FastAPI app (its ``/atropos/nccl`` routes only with ``--weight-transfer nccl``).
    """
    app = FastAPI(title="atropos-inference-node", version=__version__, docs_url=None,
                  redoc_url=None, openapi_url="/atropos/openapi.json")
    app.state.node = state
    app.include_router(status.router)
    app.include_router(weights.router)
    if state.settings.weight_transfer in ("nccl", "nccl-sparse"):
        app.include_router(nccl.router)
    app.add_exception_handler(PayloadError, _payload_error)
    app.add_exception_handler(UpdateFailed, _update_failed)
    app.add_exception_handler(DeltaRefused, _delta_refused)
    return app


__all__ = ["build_app"]
