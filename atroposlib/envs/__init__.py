"""Environments: the ``BaseEnv`` contract, ``SingleTurnEnv``/``MultiTurnEnv``, env helpers.

Public names load lazily (``from atroposlib.envs import SingleTurnEnv``), so importing the
package stays cheap.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from atroposlib.envs.runners import register_runner

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
    "check_env": "atroposlib.envs.checks",
}

__all__ = sorted(_EXPORTS)


# The standard runners behind BaseEnv's entry points. Registered here, in the package face,
# so that the env contract names none of them (they import it); each imports its runner
# module on first call only.
def _run_cli(env_cls: Any, argv: list[str] | None = None) -> None:
    from atroposlib.env_runtime.command_line import run_cli

    run_cli(env_cls, argv)


async def _serve(env: Any) -> None:
    from atroposlib.env_runtime.serve import ServeLoop

    await ServeLoop(env).run()


async def _process(env: Any, show_progress: bool = True) -> Path | None:
    from atroposlib.env_runtime.process import run_process

    return await run_process(env, show_progress=show_progress)


async def _evaluate(env: Any) -> Path:
    from atroposlib.env_runtime.process import run_evaluate

    return await run_evaluate(env)


register_runner("cli", _run_cli)
register_runner("serve", _serve)
register_runner("process", _process)
register_runner("evaluate", _evaluate)


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'atroposlib.envs' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
