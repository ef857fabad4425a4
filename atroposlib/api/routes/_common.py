"""Helpers shared by the routers: fast JSON responses and raw-body validation."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

from atroposlib.api.middleware import BODY_METHODS, PUBLIC_PATHS

JSON = "application/json"
#: Documented answer of every route that writes to the store.
STORAGE_FULL = {507: {"description": "the --db disk is full: nothing was stored or changed; "
                      "retry after the Retry-After header once space is freed"}}


def json_response(payload: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """Encode ``payload`` with orjson (bytes pass through as pre-encoded JSON)."""
    body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    return Response(body, status_code=status_code, media_type=JSON, headers=headers)


async def parse_body(request: Request, adapter: TypeAdapter) -> Any:
    """Validate the raw request body as JSON with ``adapter`` in one pass (pydantic-core).

    Raises:
        RequestValidationError: malformed JSON or a field error; FastAPI answers 422 with
            ``loc`` starting at ``"body"`` (as for any FastAPI body model).
    """
    body = await request.body()
    try:
        return adapter.validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        for error in errors:
            error["loc"] = ("body", *error["loc"])
        raise RequestValidationError(errors) from None


def body_schema(ref: str, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` documenting a JSON body read by :func:`parse_body`."""
    return {"requestBody": {"required": required, "content": {JSON: {"schema": {"$ref": ref}}}}}


def document_guard_errors(schema: dict[str, Any], secured: bool) -> None:
    """Add to an OpenAPI document the answers the request guard gives before any route runs.

    Every operation may answer 400 (a Host the server does not serve, a body that is not valid
    gzip or cannot be decoded) and 413 (a body over the size limits), and every POST 415 (a body
    that is not declared JSON). With an API key every operation but ``GET /`` may answer 401,
    and ``GET /`` is marked as needing no credentials. The CSRF guard's 403 on ``/reset_data``
    is documented on those routes themselves.

    Args:
        schema: the OpenAPI document, changed in place.
        secured: whether the server requires a bearer token.
    """
    common = {
        "400": {"description": "Malformed request: a Host this server does not serve, a gzip "
                               "body that does not inflate, or a body that cannot be decoded"},
        "413": {"description": "Request body over --max-body-bytes, or inflating past "
                               "--max-decompressed-bytes"},
    }
    not_json = {"description": "The body is not declared `Content-Type: application/json`"}
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            for code, doc in common.items():
                responses.setdefault(code, doc)
            if method.upper() in BODY_METHODS:
                responses.setdefault("415", not_json)
            if not secured:
                continue
            if path in PUBLIC_PATHS:
                operation["security"] = []
            else:
                responses.setdefault(
                    "401", {"description": "Missing or wrong `Authorization: Bearer <key>`"})
