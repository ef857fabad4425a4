"""build_app(): the FastAPI application factory of the trajectory API (routers, middleware, handlers).

Named factory.py, not app.py: a submodule named `app` would shadow the `atroposlib.api.app`
attribute that `uvicorn atroposlib.api:app` and `from atroposlib.api import app` expect.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.routing import Route

from atroposlib import __version__
from atroposlib.api.errors import ApiRequestError
from atroposlib.api.metrics import RequestTimer
from atroposlib.api.middleware import HostGuard, RequestGuard, SelectiveGZip
from atroposlib.api.models import EnvIdentifier, ScoredData
from atroposlib.api.routes import batch, data, metrics, observe, register, status
from atroposlib.api.routes._common import document_guard_errors
from atroposlib.api.settings import ApiSettings
from atroposlib.api.state import ApiState

DESCRIPTION = """\
Trajectory queue between RL environments and a trainer (Atropos 0.4 wire format).

* Environments `POST /register-env`, poll `GET /status-env`, and push scored groups with
  `POST /scored_data` (gzip accepted).
* The trainer `POST /register`s once, then polls `GET /batch` for exactly `batch_size`
  sequences at a time.
* Side tools read groups without consuming them with `GET /observe`.
* Monitoring scrapes Prometheus metrics from `GET /metrics`.

With `--api-key`, send `Authorization: Bearer <key>` on every endpoint but `GET /`.
"""


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiRequestError)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """422 as FastAPI writes it, but an echoed input JSON cannot carry (NaN, Infinity) as text."""
    assert isinstance(exc, RequestValidationError)
    errors = jsonable_encoder(exc.errors())
    for error in errors:
        if isinstance(error.get("input"), float) and not math.isfinite(error["input"]):
            error["input"] = str(error["input"])
    try:
        return JSONResponse({"detail": errors}, status_code=422)
    except ValueError:  # a non-finite value deeper inside an echoed input
        for error in errors:
            error.pop("input", None)
        return JSONResponse({"detail": errors}, status_code=422)


async def _method_not_allowed(request: Request, exc: Exception) -> JSONResponse:
    """405 whose ``Allow`` lists the methods of every route on the path, not just the first's."""
    path = request.scope["path"]
    allowed = sorted({method for route in request.app.router.routes
                      if isinstance(route, Route) and route.path_regex.match(path)
                      for method in route.methods or ()})
    return JSONResponse({"detail": "Method Not Allowed"}, status_code=405,
                        headers={"Allow": ", ".join(allowed)})


def _openapi(app: FastAPI, secured: bool) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description,
                         routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    template = "#/components/schemas/{model}"
    for name, model in (("ScoredData", ScoredData), ("EnvIdentifier", EnvIdentifier)):
        model_schema = model.model_json_schema(ref_template=template)
        components.update(model_schema.pop("$defs", {}))
        components.setdefault(name, model_schema)
    components["ScoredDataList"] = {"type": "array", "title": "ScoredDataList",
                                    "items": {"$ref": "#/components/schemas/ScoredData"}}
    document_guard_errors(schema, secured)
    if secured:
        schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        schema["security"] = [{"bearer": []}]
    app.openapi_schema = schema
    return schema


def build_app(settings: ApiSettings | None = None, state: ApiState | None = None) -> FastAPI:
    """Create the API application with a fresh state.

    Args:
        settings: server settings (defaults: in memory, no auth).
        state: an existing state to serve (default: ``ApiState(settings)``, which opens
            ``settings.db`` when set).

    Returns:
        The FastAPI app; the state is ``app.state.api`` and is closed at shutdown.
    """
    settings = settings or ApiSettings()
    api_state = state or ApiState(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            api_state.close()

    app = FastAPI(title="AtroposLib API", version=__version__, description=DESCRIPTION,
                  lifespan=lifespan)
    app.state.api = api_state
    for module in (status, register, data, batch, observe, metrics):
        app.include_router(module.router)
    app.add_exception_handler(ApiRequestError, _api_error)
    app.add_exception_handler(405, _method_not_allowed)
    app.add_exception_handler(RequestValidationError, _validation_error)
    skip = frozenset() if settings.gzip_batch else frozenset({"/batch"})
    app.add_middleware(SelectiveGZip, skip=skip, level=settings.gzip_level)
    api_key = settings.api_key_value()
    app.add_middleware(RequestGuard, api_key=api_key, max_body_bytes=settings.max_body_bytes,
                       max_decompressed_bytes=settings.max_decompressed_bytes)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_credentials=False, allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(HostGuard, allowed_hosts=settings.host_names())
    # outermost: times every answer, the guards' refusals included
    app.add_middleware(RequestTimer, latency=api_state.metrics.latency,
                       routes=[r.path for r in app.routes if isinstance(r, Route)])
    app.openapi = lambda: _openapi(app, api_key is not None)  # type: ignore[method-assign]
    return app
