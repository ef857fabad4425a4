"""Helpers shared by the routers: fast JSON responses and raw-body validation."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

JSON = "application/json"


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
