"""Serve mode's runner; it lives in :mod:`atroposlib.envs.runtime.serve` (this path stays importable)."""

from atroposlib.envs.runtime.serve import (
    OUTBOX_MAX_GROUPS,
    SERVE_STOP_EVENT,
    ServeLoop,
    offpolicy_room,
)

__all__ = ["OUTBOX_MAX_GROUPS", "SERVE_STOP_EVENT", "ServeLoop", "offpolicy_room"]
