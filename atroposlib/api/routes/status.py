"""Read-only status routes: ``/``, ``/info``, ``/wandb_info``, ``/status``, ``/status-env``."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Query, Request, Response
from fastapi.exceptions import RequestValidationError

from atroposlib.api.deps import StateDep
from atroposlib.api.models import EnvIdentifier, EnvStatus, Info, Status, WandbInfo
from atroposlib.api.routes._common import body_schema, json_response

router = APIRouter(tags=["status"])


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
async def status(state: StateDep) -> Response:
    """Current step (batches served) and the number of queued groups."""
    return json_response(state.status())


@router.get(
    "/status-env", response_model=EnvStatus,
    openapi_extra=body_schema("#/components/schemas/EnvIdentifier", required=False),
    responses={404: {"description": "env_id is not registered"}},
)
async def status_env(
    request: Request,
    state: StateDep,
    env_id: Annotated[int | None, Query(ge=0, description="The env's id (or a JSON body)")] = None,
) -> Response:
    """Queue pressure for one env (six keys); envs poll it to throttle themselves.

    The env id comes from ``?env_id=N`` or, as Atropos 0.4 clients send it, from a JSON body
    ``{"env_id": N}`` on the GET.
    """
    if env_id is None:
        raw = await request.body()
        try:
            env_id = EnvIdentifier.model_validate(orjson.loads(raw) if raw else {}).env_id
        except (orjson.JSONDecodeError, ValueError):
            raise RequestValidationError([{
                "type": "missing", "loc": ("query", "env_id"),
                "msg": 'env_id is required: pass ?env_id=N or the JSON body {"env_id": N} (N >= 0)',
            }]) from None
    return json_response(state.status_env(env_id))
