"""The trainer's route: ``GET /batch``."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Response

from atroposlib.api.deps import StateDep
from atroposlib.api.models import Batch
from atroposlib.api.routes._common import STORAGE_FULL, json_response

router = APIRouter(tags=["batch"])


#: Response header naming the step of the served batch (absent on a null batch).
STEP_HEADER = "X-Atropos-Step"


@router.get("/batch", response_model=Batch,
            responses={409: {"description": "?step=N names a step ahead of the next one, or one "
                             "whose batch is no longer kept (the X-Atropos-Oldest-Step header "
                             "names the oldest kept)"}, **STORAGE_FULL})
async def batch(
    state: StateDep,
    step: Annotated[int | None, Query(
        ge=0, description="Fetch the batch of this step: the next step serves a new batch, the "
        "step of one of the last --replay-batches served batches answers it again.")] = None,
) -> Response:
    """Serve ONE batch of exactly ``batch_size`` sequences, or ``{"batch": null}``.

    Groups are never split; among the subsets of the queue that fill a batch exactly, the one
    with the oldest groups is served, in FIFO order, and the step advances by one. Env
    ``min_batch_allocation`` minimums are honoured. The first call also lets envs register.
    Before ``/register`` the answer is
    ``{"status": "error", "message": "Trainer not registered. Call /register first.", "batch": []}``.
    The ``Server-Timing`` header gives the server time spent (ms); with a null batch,
    ``X-Atropos-Wait-Reason`` says why (too few sequences, no combination of group sizes fits,
    or an env's minimum allocation is not met).

    Steps: the first ``/register`` sets the step to its ``starting_step``; each served batch
    gets the next step (``X-Atropos-Step`` header), which ``/status`` then reports as
    ``current_step``. ``GET /batch?step=N`` serves a new batch when N is the next step, and
    answers again the batch served as step N when it is one of the last ``--replay-batches``
    (default: the trainer's checkpoint interval + 2; with ``--db`` across restarts too), so
    neither a lost reply nor a trainer restarted from a checkpoint loses a served batch: the
    restarted trainer registers with the checkpoint's step (the server keeps its own step)
    and fetches the steps after it. Any other N gets 409: ahead of the next step, or older
    than the oldest kept one, which the message and ``X-Atropos-Oldest-Step`` name.
    """
    start = time.perf_counter()
    body, info = state.next_batch() if step is None else state.batch_for_step(step)
    elapsed_ms = (time.perf_counter() - start) * 1e3
    headers = {"Server-Timing": f"app;dur={elapsed_ms:.2f}"}
    if "step" in info:
        headers[STEP_HEADER] = str(info["step"])
    if info.get("reason"):
        headers["X-Atropos-Wait-Reason"] = info["reason"]
    return json_response(body, headers=headers)
