"""Environments: the ``BaseEnv`` contract, ``SingleTurnEnv``/``MultiTurnEnv``, env helpers.

Public names load lazily (``from atroposlib.envs import SingleTurnEnv``), so importing the
package stays cheap. ``check_env``, the contract checker authors use in their tests, lives
with the runners it drives the env like (:mod:`atroposlib.env_runtime.checks`).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BaseEnv": "atroposlib.envs.base",
    "BaseEnvConfig": "atroposlib.envs.base",
    "ScoredDataGroup": "atroposlib.envs.base",
    "ScoredDataItem": "atroposlib.envs.base",
    "APIServerConfig": "atroposlib.envs.base",
    "SingleTurnEnv": "atroposlib.envs.single_turn",
    "SingleTurnEnvConfig": "atroposlib.envs.single_turn",
    "MultiTurnEnv": "atroposlib.envs.multi_turn",
    "MultiTurnEnvConfig": "atroposlib.envs.multi_turn",
    "check_env": "atroposlib.env_runtime.checks",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'atroposlib.envs' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
