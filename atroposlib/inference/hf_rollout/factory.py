"""create_app(): the in-process sampler's FastAPI application (routers and error handlers)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from atroposlib.inference.hf_rollout.engine import BadPrompt, HFRollout
from atroposlib.inference.hf_rollout.routes import WrongModel, chat, completions, models


def error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    """An error answer in the shape OpenAI and vLLM use (``{"error": {...}}``)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


async def _bad_request(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, RequestValidationError):
        message = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}"
                            for e in exc.errors())
    else:
        message = str(exc)
    return JSONResponse(error_body(message, "BadRequestError", 400), status_code=400)


async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(error_body(str(exc), "NotFoundError", 404), status_code=404)


def create_app(engine: HFRollout) -> FastAPI:
    """The OpenAI-compatible app serving ``engine``'s policy.

    Errors: a request that fails validation, asks for an unsupported sampling option, or does
    not fit the context gets a 400 saying what to change; a wrong model name a 404.
    """
    app = FastAPI(title="atroposlib in-process sampler", docs_url=None, redoc_url=None)
    app.state.engine = engine
    for router in (completions, chat, models):
        app.include_router(router)
    app.add_exception_handler(RequestValidationError, _bad_request)
    app.add_exception_handler(BadPrompt, _bad_request)
    app.add_exception_handler(WrongModel, _not_found)
    return app


__all__ = ["create_app", "error_body"]
