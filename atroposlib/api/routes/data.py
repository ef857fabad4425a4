"""Routes where environments push scored groups, plus the latest example and the reset."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from pydantic import TypeAdapter

from atroposlib.api.deps import StateDep
from atroposlib.api.errors import ApiRequestError, IdempotencyKeyError
from atroposlib.api.models import (
    LatestExamplePlaceholder,
    ScoredData,
    ScoredDataListResponse,
    ScoredDataResponse,
)
from atroposlib.api.routes._common import STORAGE_FULL, body_schema, json_response, parse_body
from atroposlib.api.state import ApiState

router = APIRouter(tags=["data"])
_ONE = TypeAdapter(ScoredData)
_MANY = TypeAdapter(list[ScoredData])
_ERRORS = {
    404: {"description": "env_id is not registered"},
    413: {"description": "body too large, or a group larger than the whole queue"},
    422: {"description": "malformed group (shapes, messages, size vs group_size/batch_size)"},
    429: {"description": "queue full; retry after the Retry-After header (nothing was stored)"},
    **STORAGE_FULL,
}
#: Longest ``Idempotency-Key`` accepted (characters).
MAX_IDEMPOTENCY_KEY = 255
#: Set on an answer repeated for an ``Idempotency-Key`` seen before.
REPLAYED_HEADER = "Idempotent-Replayed"
IdempotencyKey = Annotated[str | None, Header(
    alias="Idempotency-Key", max_length=MAX_IDEMPOTENCY_KEY,
    description="Optional: a unique key per request (e.g. a UUID), sent again unchanged on "
    "every retry of that request. A repeat gets the first answer (with `Idempotent-Replayed: "
    "true`) and stores nothing twice.",
)]


def _reply_one(results: list[dict[str, Any]]) -> bytes:
    return orjson.dumps(results[0])


def _reply_list(results: list[dict[str, Any]]) -> bytes:
    body: dict[str, Any] = {"status": "received", "groups_processed": len(results)}
    buffered = [r for r in results if r["status"] == "buffered"]
    if buffered:
        body["buffered"] = len(buffered)
        body["last_buffer_size"] = buffered[-1]["buffer_size"]
    return orjson.dumps(body)


async def _store(request: Request, state: ApiState, key: str | None, adapter: TypeAdapter,
                 render: Callable[[list[dict[str, Any]]], bytes]) -> Response:
    """Validate the body and queue its groups, once per ``Idempotency-Key`` when one is sent.

    Counts the groups accepted (not a repeated answer) or refused, with the refusal's reason.
    """
    metrics = state.metrics
    try:
        parsed = await parse_body(request, adapter)
    except RequestValidationError:
        metrics.refused.labels("malformed").inc()
        raise
    groups = parsed if isinstance(parsed, list) else [parsed]
    try:
        if key is None:
            body, replayed = render(state.ingest(groups)), False
        elif not key:
            raise IdempotencyKeyError("the Idempotency-Key header is empty; send a unique key "
                                      "per request (e.g. a UUID), or no header")
        else:
            fingerprint = hashlib.sha1(await request.body(), usedforsecurity=False).hexdigest()
            body, replayed = state.ingest_once(f"{request.url.path} {key}", fingerprint, groups,
                                               render)
    except ApiRequestError as exc:
        metrics.refused.labels(exc.reason).inc(len(groups))
        raise
    if not replayed:
        metrics.count_accepted(groups, state.envs)
    return json_response(body, headers={REPLAYED_HEADER: "true"} if replayed else None)


@router.post(
    "/scored_data", response_model=ScoredDataResponse, response_model_exclude_none=True,
    openapi_extra=body_schema("#/components/schemas/ScoredData"), responses=_ERRORS,
)
async def scored_data(request: Request, state: StateDep, key: IdempotencyKey = None) -> Response:
    """Queue one scored group (gzip bodies accepted).

    A group with fewer sequences than its env's group_size is buffered and merged with other
    partial groups of that env into one full group (``{"status": "buffered", "buffer_size"}``).
    With an ``Idempotency-Key`` header, a retry of the same request is answered as the first
    time and the group is stored once (keys are remembered across restarts with ``--db``).
    """
    return await _store(request, state, key, _ONE, _reply_one)


@router.post(
    "/scored_data_list", response_model=ScoredDataListResponse, response_model_exclude_none=True,
    openapi_extra=body_schema("#/components/schemas/ScoredDataList"), responses=_ERRORS,
)
async def scored_data_list(request: Request, state: StateDep, key: IdempotencyKey = None) -> Response:
    """Queue several groups at once, in order; all are stored or none (e.g. on 429).

    ``Idempotency-Key`` works as for ``/scored_data``: one key covers the whole list.
    """
    return await _store(request, state, key, _MANY, _reply_list)


@router.get("/latest_example", response_model=ScoredData | LatestExamplePlaceholder)
async def latest_example(state: StateDep) -> Response:
    """The last group that entered the queue (all 14 keys), or an empty placeholder.

    The placeholder (before any group was queued) has nine keys, all empty arrays, including
    ``generation_params`` (an object in real groups), as Atropos 0.4 answers.
    """
    return json_response(state.latest_example())


_CROSS_SITE = {403: {"description": "sent by a browser page of another site"}, **STORAGE_FULL}


@router.get("/reset_data", response_class=PlainTextResponse, responses=_CROSS_SITE)
async def reset_data(state: StateDep) -> PlainTextResponse:
    """Forget everything: queue, buffers, envs, registration, step and latest example.

    A GET for Atropos 0.4 compatibility (``POST /reset_data`` also works). Refused (403) when a
    browser page of another site sends it. Cursors of ``/observe`` keep increasing.
    """
    state.reset()
    return PlainTextResponse("Reset successful")


@router.post("/reset_data", response_class=PlainTextResponse, responses=_CROSS_SITE)
async def reset_data_post(state: StateDep) -> PlainTextResponse:
    """Same as ``GET /reset_data``."""
    state.reset()
    return PlainTextResponse("Reset successful")
