"""``POST /atropos/nccl/*``: vLLM's NCCL weight transfer, driven by a trainer, behind the node's gate.

Never run in this project (no GPU here); written from vLLM 0.32's weight-transfer docs and its
source. The routes mirror vLLM's own ``/init_weight_transfer_engine``, ``/start_weight_update``,
``/update_weights``, ``/finish_weight_update`` and ``/shutdown_weight_transfer_engine`` (which
vLLM serves only in its unauthenticated development mode), with two differences: they need the
node's bearer token, and ``start`` closes the node's gate and pauses vLLM until ``finish``
records the new policy version, so no completion is served on a half-received update. A trainer
drives them through :class:`atroposlib.inference.weights.nccl.NodeWeightSyncClient`.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from atroposlib.inference.node.deps import StateDep
from atroposlib.inference.node.models import NcclFinish, NcclInit, NcclUpdate, WeightsApplied

router = APIRouter(prefix="/atropos/nccl", tags=["nccl"])


@router.post("/init")
async def init(body: NcclInit, state: StateDep) -> dict[str, str]:
    """Join the trainer's NCCL group (blocks until the trainer joins too)."""
    await state.engine.nccl_init(body.init_info)
    return {"status": "initialized"}


@router.post("/start")
async def start(state: StateDep) -> dict[str, str]:
    """Close the gate, let completions in flight finish, pause vLLM, start the update."""
    if state.updating:
        raise HTTPException(409, "an update is already in progress; finish it first")
    await state.begin_external_update()
    try:
        await state.engine.nccl_start()
    except Exception as exc:
        await state.end_external_update(None, exc)
        raise
    return {"status": "started"}


@router.post("/update")
async def update(body: NcclUpdate, state: StateDep) -> dict[str, str]:
    """Receive one broadcast (the trainer sends it meanwhile) into the model."""
    if not state.updating:
        raise HTTPException(409, "POST /atropos/nccl/start before /update")
    try:
        await state.engine.nccl_update(body.update_info)
    except Exception as exc:
        await state.end_external_update(None, exc)
        raise
    return {"status": "updated"}


@router.post("/finish", response_model=WeightsApplied)
async def finish(body: NcclFinish, state: StateDep) -> WeightsApplied:
    """Finish the update, drop the prefix cache and serve it as ``version``."""
    if not state.updating:
        raise HTTPException(409, "POST /atropos/nccl/start before /finish")
    try:
        await state.engine.nccl_finish(body.version)
        await state.engine.reset_prefix_cache()
    except Exception as exc:
        await state.end_external_update(None, exc)
        raise
    await state.end_external_update(body.version)
    assert state.last_update is not None
    return WeightsApplied(policy_version=body.version, update=state.last_update)


@router.post("/shutdown")
async def shutdown(state: StateDep) -> dict[str, str]:
    """Leave the trainer's NCCL group (vLLM keeps serving)."""
    await state.engine.nccl_shutdown()
    return {"status": "shut down"}
