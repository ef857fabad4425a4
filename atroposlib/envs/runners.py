"""Registry of runners: what ``BaseEnv``'s entry points hand an env (or env class) to.

The env contract (``atroposlib.envs.base``) must not import the code that drives it (the
serve loop, the process/evaluate runners, the CLI), which all import the contract. So the
contract looks its runners up here by mode, and the ``atroposlib.envs`` package fills this
registry when it is first imported (always before ``base``, as its parent package), with
functions that import the runner on first call. A program may register its own runner for
a mode, e.g. to drive envs differently in tests.

Modes and call signatures:
    * ``"cli"``: ``runner(env_cls, argv)`` runs the command line (``BaseEnv.cli``).
    * ``"serve"``: ``await runner(env)`` serves until told to stop (``BaseEnv.env_manager``).
    * ``"process"``: ``await runner(env, show_progress)`` -> JSONL path or None
      (``BaseEnv.process_manager``).
    * ``"evaluate"``: ``await runner(env)`` -> ``metrics.json`` path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_RUNNERS: dict[str, Callable[..., Any]] = {}


def register_runner(mode: str, runner: Callable[..., Any]) -> None:
    """Make ``runner`` the one ``BaseEnv`` uses for ``mode`` (replacing any earlier one)."""
    _RUNNERS[mode] = runner


def get_runner(mode: str) -> Callable[..., Any]:
    """The runner registered for ``mode``.

    Raises:
        LookupError: none is registered (the ``atroposlib.envs`` package registers the
            standard ones on import, so this means the registry was cleared or the mode is
            misspelled).
    """
    try:
        return _RUNNERS[mode]
    except KeyError:
        raise LookupError(
            f"no env runner registered for mode {mode!r} (registered: {sorted(_RUNNERS)}); "
            "import atroposlib.envs, which registers the standard runners, or call "
            "atroposlib.envs.runners.register_runner"
        ) from None


__all__ = ["get_runner", "register_runner"]
