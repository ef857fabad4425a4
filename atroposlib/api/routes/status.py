"""Read-only status routes: ``/``, ``/info``, ``/wandb_info``, ``/status``, ``/status-env``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter

from atroposlib.api.deps import StateDep
from atroposlib.api.models import MAX_SIZE, EnvIdentifier, EnvStatus, Info, Status, WandbInfo
from atroposlib.api.routes._common import body_schema, json_response, parse_body

router = APIRouter(tags=["status"])
_ENV_ID = TypeAdapter(EnvIdentifier)


@router.get("/")
async def root() -> dict:
    """Liveness: ``{"message": "AtroposLib API"}`` (never needs the API key)."""
    return {"message": "AtroposLib API"}


@router.get("/info", response_model=Info)
async def info(state: StateDep) -> Response:
    """The trainer's ``batch_size`` and ``max_token_len`` (-1 before ``/register``)."""
    return json_response(state.info())


@router.get("/wandb_info", response_model=WandbInfo)
async def wandb_info(state: StateDep) -> Response:
    """W&B ``group`` and ``project`` of the run (null before ``/register``)."""
    return json_response(state.wandb_info())


@router.get("/status", response_model=Status)
async def status(
    state: StateDep,
    ledger: Annotated[bool, Query(description="Add the run ledger (as GET /ledger) under "
                                  "`ledger`; without it the answer is Atropos 0.4's.")] = False,
) -> Response:
    """Current step (batches served) and the number of queued groups (and the ledger on request)."""
    return json_response(state.status(ledger))


@router.get("/ledger")
async def ledger(
    state: StateDep,
    entries: Annotated[int, Query(ge=0, le=10_000, description="Also return up to this many "
                                  "journal entries (0: none).")] = 0,
    after: Annotated[int, Query(ge=0, description="Only entries whose seq is above this.")] = 0,
) -> Response:
    """The run ledger: what became of every rollout and completion token run-api saw.

    ``rollouts``: ``sampled = completed + masked + failed``; ``tokens``: ``sampled = served +
    dropped_stale + dropped_filter + dropped_masked + queued``; ``closes`` says both hold (see
    docs/guides/ledger.md). An atroposlib extension: stock Atropos servers have no such route.
    """
    return json_response(state.ledger(entries, after))


@router.get(
    "/status-env", response_model=EnvStatus,
    openapi_extra=body_schema("#/components/schemas/EnvIdentifier", required=False),
    responses={
        404: {"description": "env_id is not registered"},
        422: {"description": "env_id is missing (give `?env_id=N` or the body "
                            '`{"env_id": N}`) or not an integer in 0..2**31'},
    },
)
async def status_env(
    request: Request,
    state: StateDep,
    # typed int, not int | None, so the document does not offer `?env_id=null`
    env_id: Annotated[int, Query(ge=0, le=MAX_SIZE,
                                 description="The env's id (or a JSON body)")] = None,  # type: ignore[assignment]
) -> Response:
    """Queue pressure for one env; envs poll it to throttle themselves.

    Six keys, plus the staleness limit and this env's stale drops when a limit is set.

    The env id comes from ``?env_id=N`` or, as Atropos 0.4 clients send it, from a JSON body
    ``{"env_id": N}`` on the GET; one of the two is required (422 without either).
    """
    if env_id is None:
        raw = await request.body()
        if not raw.strip():
            raise RequestValidationError([{
                "type": "missing", "loc": ("query", "env_id"),
                "msg": 'env_id is required: pass ?env_id=N or the JSON body {"env_id": N} (N >= 0)',
            }])
        env_id = (await parse_body(request, _ENV_ID)).env_id
    return json_response(state.status_env(env_id))
