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
from atroposlib.api.routes._common import STORAGE_FULL

router = APIRouter(tags=["register"])


@router.post("/register", response_model=RegistrationResponse, responses=STORAGE_FULL)
async def register(registration: Registration, state: StateDep) -> dict:
    """The trainer registers the run: batch size (sequences), limits, W&B names, starting step.

    The first call sets the step to ``starting_step``. A second call (a restarted trainer)
    updates the settings and keeps queued data and envs (call ``/reset_data`` first to start
    from scratch). When its ``starting_step`` is at most the server's step (a trainer resuming
    from a checkpoint, or an Atropos 0.4 trainer registering with 0 again), the step is NOT
    renumbered and the served batches stay fetchable: ``GET /batch?step=N`` for N from
    ``starting_step + 1`` to ``current_step`` answers the batches the trainer had fetched but
    not trained on (those still kept: ``oldest_replayable_step``), then serves new ones. A
    ``starting_step`` past the server's step sets the step to it.

    With ``vocab_size`` (and always ``max_token_len``), groups the model cannot train on are
    refused from then on (422 naming the group, its env and the likely cause).
    """
    return state.register(registration)


@router.post("/register-env", response_model=RegisterEnvResponse, response_model_exclude_none=True,
             responses=STORAGE_FULL)
async def register_env(registration: RegisterEnv, state: StateDep) -> dict:
    """An environment registers.

    Answers ``{"status": "wait for trainer to start"}`` until the trainer's first
    ``GET /batch``, then the env's id, W&B name and the run settings.
    """
    return state.register_env(registration)


@router.post("/disconnect-env", responses={404: {"description": "env_id is not registered"},
                                           **STORAGE_FULL})
async def disconnect_env(env: EnvIdentifier, state: StateDep) -> dict:
    """Mark an env disconnected: it stops counting for weights and minimum allocations.

    Unknown env ids get 404.
    """
    return state.disconnect_env(env.env_id)
