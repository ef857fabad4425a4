"""Routes where the trainer and the environments register (and environments disconnect)."""

from __future__ import annotations

from fastapi import APIRouter

from atroposlib.api.deps import StateDep
from atroposlib.api.models import (
    EnvIdentifier,
    RegisterEnv,
    RegisterEnvResponse,
    Registration,
    RegistrationResponse,
)

router = APIRouter(tags=["register"])


@router.post("/register", response_model=RegistrationResponse)
async def register(registration: Registration, state: StateDep) -> dict:
    """The trainer registers the run: batch size (sequences), W&B names, starting step.

    A second call updates these settings and the step, keeping queued data and envs (call
    ``/reset_data`` first to start from scratch).
    """
    return {"uuid": state.register(registration)}


@router.post("/register-env", response_model=RegisterEnvResponse, response_model_exclude_none=True)
async def register_env(registration: RegisterEnv, state: StateDep) -> dict:
    """An environment registers.

    Answers ``{"status": "wait for trainer to start"}`` until the trainer's first
    ``GET /batch``, then the env's id, W&B name and the run settings.
    """
    return state.register_env(registration)


@router.post("/disconnect-env", responses={404: {"description": "env_id is not registered"}})
async def disconnect_env(env: EnvIdentifier, state: StateDep) -> dict:
    """Mark an env disconnected: it stops counting for weights and minimum allocations.

    Unknown env ids get 404.
    """
    return state.disconnect_env(env.env_id)
