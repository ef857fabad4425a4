"""The trainer's route: ``GET /batch``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Response

from atroposlib.api.deps import StateDep
from atroposlib.api.models import Batch
from atroposlib.api.routes._common import json_response

router = APIRouter(tags=["batch"])


@router.get("/batch", response_model=Batch)
async def batch(state: StateDep) -> Response:
    """Serve ONE batch of exactly ``batch_size`` sequences, or ``{"batch": null}``.

    Groups are never split; among the subsets of the queue that fill a batch exactly, the one
    with the oldest groups is served, in FIFO order, and the step advances by one. Env
    ``min_batch_allocation`` minimums are honoured. The first call also lets envs register.
    Before ``/register`` the answer is
    ``{"status": "error", "message": "Trainer not registered. Call /register first.", "batch": []}``.
    The ``Server-Timing`` header gives the server time spent (ms); with a null batch,
    ``X-Atropos-Wait-Reason`` says why (too few sequences, no combination of group sizes fits,
    or an env's minimum allocation is not met).
    """
    start = time.perf_counter()
    body, info = state.next_batch()
    elapsed_ms = (time.perf_counter() - start) * 1e3
    headers = {"Server-Timing": f"app;dur={elapsed_ms:.2f}"}
    if info.get("reason"):
        headers["X-Atropos-Wait-Reason"] = info["reason"]
    return json_response(body, headers=headers)
