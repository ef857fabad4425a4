"""Registry of runners: what ``BaseEnv``'s entry points hand an env (or env class) to.

The env contract (``atroposlib.envs.base``) does not import the code that drives it (the
serve loop, the process/evaluate runners, the CLI in :mod:`atroposlib.env_runtime`), which all
import the contract. So the contract looks its runner up here by mode. The standard runners
are named, like entry points, by ``"module:function"`` in :data:`DEFAULT_RUNNERS` and imported
on first use. A program may register its own runner for a mode, e.g. to drive envs
differently in tests.

Modes and call signatures:
    * ``"cli"``: ``runner(env_cls, argv)`` runs the command line (``BaseEnv.cli``).
    * ``"serve"``: ``await runner(env)`` serves until told to stop (``BaseEnv.env_manager``).
    * ``"process"``: ``await runner(env, show_progress)`` -> JSONL path or None
      (``BaseEnv.process_manager``).
    * ``"evaluate"``: ``await runner(env)`` -> ``metrics.json`` path.
    * ``"deliver"``: ``await runner(env, checked_groups, item, send_to_api)`` -> the accepted
      groups (``BaseEnv.handle_send_to_api``, after its check).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The standard runner of each mode, as ``"module:function"`` (imported on first use).
DEFAULT_RUNNERS = {
    "cli": "atroposlib.env_runtime.command_line:run_cli",
    "serve": "atroposlib.env_runtime.serve:serve",
    "process": "atroposlib.env_runtime.process:run_process",
    "evaluate": "atroposlib.env_runtime.process:run_evaluate",
    "deliver": "atroposlib.env_runtime.delivery:deliver_checked",
}

_RUNNERS: dict[str, Callable[..., Any]] = {}


def register_runner(mode: str, runner: Callable[..., Any]) -> None:
    """Make ``runner`` the one ``BaseEnv`` uses for ``mode`` (replacing any earlier one)."""
    _RUNNERS[mode] = runner


def get_runner(mode: str) -> Callable[..., Any]:
    """The runner registered for ``mode``, else the standard one (imported now).

    Raises:
        LookupError: ``mode`` has neither a registered nor a standard runner.
    """
    if mode not in _RUNNERS:
        if mode not in DEFAULT_RUNNERS:
            raise LookupError(
                f"no env runner for mode {mode!r} (modes: {sorted({*_RUNNERS, *DEFAULT_RUNNERS})}); "
                "register one with atroposlib.envs.runners.register_runner"
            )
        module, _, name = DEFAULT_RUNNERS[mode].partition(":")
        _RUNNERS[mode] = getattr(importlib.import_module(module), name)
    return _RUNNERS[mode]


class RunnerEntryMixin:
    """``BaseEnv``'s entry points: each hands the env (or its class) to the runner of its mode."""

    async def process_manager(self, show_progress: bool = True) -> Path | None:
        """Process mode: write ``config.total_steps`` groups to JSONL + HTML without an API.

        Returns the JSONL path, or None when nothing was written.
        """
        return await get_runner("process")(self, show_progress)

    async def _evaluate_and_save(self) -> Path:
        """Evaluate mode: run ``evaluate`` once and write its files; returns ``metrics.json``."""
        return await get_runner("evaluate")(self)

    async def env_manager(self) -> None:
        """Serve mode: register with the API and keep it fed with groups until told to stop."""
        await get_runner("serve")(self)

    @classmethod
    def cli(cls, argv: list[str] | None = None) -> None:
        """Run the command line: ``python my_env.py serve|process|evaluate [--env.* ...]``."""
        get_runner("cli")(cls, argv)


__all__ = ["DEFAULT_RUNNERS", "RunnerEntryMixin", "get_runner", "register_runner"]
