"""Routes where environments push scored groups, plus the latest example and the reset."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from pydantic import TypeAdapter

from atroposlib.api.deps import StateDep
from atroposlib.api.models import (
    LatestExamplePlaceholder,
    ScoredData,
    ScoredDataListResponse,
    ScoredDataResponse,
)
from atroposlib.api.routes._common import body_schema, json_response, parse_body

router = APIRouter(tags=["data"])
_ONE = TypeAdapter(ScoredData)
_MANY = TypeAdapter(list[ScoredData])
_ERRORS = {
    404: {"description": "env_id is not registered"},
    413: {"description": "body too large, or a group larger than the whole queue"},
    422: {"description": "malformed group (shapes, messages, size vs group_size/batch_size)"},
    429: {"description": "queue full; retry after the Retry-After header (nothing was stored)"},
}


@router.post(
    "/scored_data", response_model=ScoredDataResponse, response_model_exclude_none=True,
    openapi_extra=body_schema("#/components/schemas/ScoredData"), responses=_ERRORS,
)
async def scored_data(request: Request, state: StateDep) -> Response:
    """Queue one scored group (gzip bodies accepted).

    A group with fewer sequences than its env's group_size is buffered and merged with other
    partial groups of that env into one full group (``{"status": "buffered", "buffer_size"}``).
    """
    group = await parse_body(request, _ONE)
    return json_response(state.ingest([group])[0])


@router.post(
    "/scored_data_list", response_model=ScoredDataListResponse, response_model_exclude_none=True,
    openapi_extra=body_schema("#/components/schemas/ScoredDataList"), responses=_ERRORS,
)
async def scored_data_list(request: Request, state: StateDep) -> Response:
    """Queue several groups at once, in order; all are stored or none (e.g. on 429)."""
    groups = await parse_body(request, _MANY)
    results = state.ingest(groups)
    body: dict = {"status": "received", "groups_processed": len(groups)}
    buffered = [r for r in results if r["status"] == "buffered"]
    if buffered:
        body["buffered"] = len(buffered)
        body["last_buffer_size"] = buffered[-1]["buffer_size"]
    return json_response(body)


@router.get("/latest_example", response_model=ScoredData | LatestExamplePlaceholder)
async def latest_example(state: StateDep) -> Response:
    """The last group that entered the queue (all 14 keys), or an empty placeholder.

    The placeholder (before any group was queued) has nine keys, all empty arrays, including
    ``generation_params`` (an object in real groups), as Atropos 0.4 answers.
    """
    return json_response(state.latest_example())


_CROSS_SITE = {403: {"description": "sent by a browser page of another site"}}


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
