"""``GET /observe``: a read-only cursor over accepted groups for side tools (viewers, loggers)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from atroposlib.api.deps import StateDep
from atroposlib.api.models import ScoredData
from atroposlib.api.routes._common import json_response

router = APIRouter(tags=["observe"])
MAX_LIMIT = 1000


class ObservedGroup(BaseModel):
    """One accepted group as seen by an observer."""

    cursor: int = Field(description="Monotonic id of the group (never reused, even after reset).")
    env_id: int | None = Field(description="Sender's env id, or null.")
    received_at: float = Field(description="UNIX time the group entered the queue.")
    group: ScoredData = Field(description="The group exactly as /batch serves it (14 keys).")


class ObserveResponse(BaseModel):
    """``GET /observe`` response."""

    groups: list[ObservedGroup] = Field(description="Groups with cursor > after, oldest first.")
    next_cursor: int = Field(description="Pass as `after` on the next call.")


@router.get("/observe", response_model=ObserveResponse)
async def observe(
    state: StateDep,
    after: Annotated[int, Query(description="Return groups with a cursor greater than this.")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Most groups to return.")] = 100,
    env_id: Annotated[int | None, Query(ge=0, description="Only this env's groups.")] = None,
) -> Response:
    """Read accepted groups WITHOUT taking them from the trainer's queue.

    Every queued group is readable, and so are the most recently served ones (a retention window
    set by ``--observe-retention-groups`` / ``--observe-retention-tokens``; persisted with
    ``--db``). Poll with ``after=next_cursor`` to tail the run.
    """
    return json_response(state.observe(after, limit, env_id))
