"""create_app(): the FastAPI application factory of the ManagedServer proxy."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from atroposlib.proxy.errors import (
    ProxyHTTPError,
    error_body,
    validation_message,
)
from atroposlib.proxy.models import ProxyConfig, ProxySettings
from atroposlib.proxy.routes import completions, service, sessions
from atroposlib.proxy.state import ProxyState

logger = logging.getLogger(__name__)


def openai_error(status_code: int, message: str,
                 error_type: str = "invalid_request_error") -> JSONResponse:
    """A JSON error response in OpenAI's shape, as the proxy's routes answer errors.

    Args:
        status_code: the HTTP status; it is also the body's ``code`` (Atropos 0.4's form).
        message: what went wrong, for the caller.
        error_type: OpenAI's error ``type`` (``invalid_request_error``, ``server_error`` ...).

    Returns:
        ``JSONResponse`` with body ``{"error": {"message", "type", "code"}}``.
    """
    return JSONResponse(error_body(message, error_type, status_code), status_code=status_code)


async def _proxy_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ProxyHTTPError)
    return JSONResponse(error_body(exc.message, exc.type, exc.code), status_code=exc.status_code)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    """A bad body is a 400 in OpenAI format (FastAPI's default would be a 422)."""
    assert isinstance(exc, RequestValidationError)
    return JSONResponse(
        error_body(f"invalid request: {validation_message(exc)}", "invalid_request_error",
                   "invalid_request"),
        status_code=400,
    )


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(error_body(str(exc.detail), type_, None), status_code=exc.status_code)


def _prebuilt_state(state: ProxyState, server_manager: Any, tokenizer: Any,
                    model_name: str) -> None:
    """Serve already-built backends; their configs are not validated (they may be test doubles)."""
    state.config = ProxyConfig.model_construct(
        model_name=model_name,
        tokenizer_name=getattr(tokenizer, "name_or_path", None),
        servers=[getattr(s, "config", None) for s in getattr(server_manager, "servers", [])],
    )
    state.manager, state.tokenizer = server_manager, tokenizer


def create_app(
    config: ProxyConfig | dict[str, Any] | None = None,
    settings: ProxySettings | None = None,
    *,
    server_manager: Any = None,
    tokenizer: Any = None,
    model_name: str | None = None,
) -> FastAPI:
    """Build the proxy's FastAPI app.

    Two forms: ``create_app(config, settings)`` builds its own backends from a config, and
    ``create_app(server_manager=..., tokenizer=..., model_name=...)`` (the Atropos 0.4 form)
    serves an already-built ``ServerManager`` and tokenizer.

    Args:
        config: the backends (a :class:`ProxyConfig` or its dict); None = configure later with
            ``POST /setup``.
        settings: TTL and session cap; default :class:`ProxySettings()`.
        server_manager: a ready ``ServerManager`` to serve (keyword-only; with ``tokenizer``
            and ``model_name``, and without ``config``).
        tokenizer: the HF tokenizer of ``server_manager``'s model.
        model_name: the model name reported by ``/health`` and ``/v1/models``.

    Returns:
        A FastAPI application (its :class:`ProxyState` is ``app.state.proxy``); serve it with
        uvicorn. At start-up it builds the configured backends (a bad ``tokenizer_name`` fails
        then), and a background task sweeps idle sessions; at shutdown every session is deleted
        and the backends are closed.

    Raises:
        pydantic.ValidationError: ``config`` is a dict that does not match :class:`ProxyConfig`.
        TypeError: ``config`` combined with the ``server_manager`` form, or that form missing
            one of its three keywords.
    """
    prebuilt = (server_manager, tokenizer, model_name)
    if any(value is not None for value in prebuilt):
        if config is not None:
            raise TypeError(
                "create_app takes either config (and settings) or server_manager=, tokenizer=, "
                "model_name=, not both"
            )
        if any(value is None for value in prebuilt):
            raise TypeError(
                "create_app(server_manager=..., tokenizer=..., model_name=...) needs all three "
                "keywords"
            )
    if isinstance(config, dict):
        config = ProxyConfig.model_validate(config)
    state = ProxyState(config, settings or ProxySettings())
    if server_manager is not None:
        _prebuilt_state(state, server_manager, tokenizer, model_name or "")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def reaper() -> None:
            interval = min(30.0, max(0.05, state.settings.session_ttl_s / 4))
            while True:
                await asyncio.sleep(interval)
                try:
                    await state.sweep()
                except Exception:  # noqa: BLE001 - keep sweeping
                    logger.exception("session sweep failed")

        if state.config is not None:
            # Load the tokenizer and build the backends now: a bad tokenizer_name fails at
            # start-up, and the first session is not slowed by importing transformers.
            await state.ensure_backends()
        task = asyncio.create_task(reaper(), name="proxy-session-reaper")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await state.close_sessions()
            if state.manager is not None:
                await state.manager.aclose()

    app = FastAPI(title="atroposlib ManagedServer proxy", lifespan=lifespan)
    app.state.proxy = state
    for module in (service, sessions, completions):
        app.include_router(module.router)
    app.add_exception_handler(ProxyHTTPError, _proxy_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    return app
