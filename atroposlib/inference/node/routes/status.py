"""``GET /atropos/status`` (what the node serves, where it runs) and ``POST /atropos/probe``."""

from __future__ import annotations

from pathlib import Path

from anyio import to_thread
from fastapi import APIRouter, HTTPException

from atroposlib.inference.node.deps import StateDep
from atroposlib.inference.node.models import PROBE_PREFIX, NodeStatus, PathProbe, PathProbeResult

router = APIRouter(prefix="/atropos", tags=["status"])


@router.get("/status", response_model=NodeStatus)
async def status(state: StateDep) -> NodeStatus:
    """The policy version served, the node's state, its host and vLLM's dtype."""
    return state.status()


def _read_probe(path: Path, content: str) -> PathProbeResult:
    try:
        with open(path, "rb") as handle:
            found = handle.read(257)
    except OSError:
        return PathProbeResult(readable=False, matches=False)
    return PathProbeResult(readable=True, matches=found == content.encode())


@router.post("/probe", response_model=PathProbeResult)
async def probe(body: PathProbe, state: StateDep) -> PathProbeResult:
    """Whether this node reads the trainer's probe file: then both share that directory.

    Only absolute paths to files named ``.atropos-probe-*`` are read (at most 257 bytes).
    """
    path = Path(body.path)
    if not path.is_absolute() or not path.name.startswith(PROBE_PREFIX):
        raise HTTPException(422, f"probe an absolute path to a file named {PROBE_PREFIX}*, "
                                 f"got {body.path!r}")
    return await to_thread.run_sync(_read_probe, path, body.content)
