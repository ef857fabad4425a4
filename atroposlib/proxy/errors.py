"""Errors of the ManagedServer proxy, both sides, in the OpenAI error format.

The server raises :class:`ProxyHTTPError` inside a route and the app answers it as
``{"error": {"message", "type", "code"}}``; the client turns such an answer back into a
:class:`ProxyError`.
"""

from __future__ import annotations

from typing import Any

from atroposlib.errors import AtroposError, ProxyError  # noqa: F401 - the client's error, re-exported


class ProxyHTTPError(AtroposError):
    """An error the proxy answers in OpenAI format (raised inside route handlers).

    Attributes:
        status_code: HTTP status.
        message: what is wrong and how to fix it.
        type: OpenAI error type (``invalid_request_error``, ``not_found_error``, ...).
        code: short machine-readable code.
    """

    def __init__(self, status_code: int, message: str, type: str, code: str | None = None):  # noqa: A002
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.code = code


def error_body(message: str, type_: str, code: str | int | None) -> dict[str, Any]:
    """The OpenAI error body ``{"error": {"message", "type", "code"}}``."""
    return {"error": {"message": message, "type": type_, "code": code}}


def validation_message(exc: Any) -> str:
    """One line ``field.path: message; ...`` from a pydantic or FastAPI validation error."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "; ".join(parts)
