"""``GET /metrics``: run-api's Prometheus metrics (text exposition format)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from atroposlib.api.deps import StateDep
from atroposlib.utils.prometheus import CONTENT_TYPE

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text format"}})
async def metrics(state: StateDep) -> Response:
    """Prometheus metrics of this run-api (text format; names in ``docs/metrics.md``).

    Queue depth in groups and tokens, groups accepted and refused by reason, batches served,
    staleness of served groups, request latency.

    Needs the API key like every route but ``GET /`` (in Prometheus: ``authorization:
    {credentials_file: ...}``), and the scrape's Host must be one run-api answers to
    (``--allowed-hosts``).
    """
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)
