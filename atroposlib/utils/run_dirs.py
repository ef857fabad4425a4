"""Run directories: a fresh ``runs/<UTC timestamp>[-N]`` per run, created exclusively, never shared.

Two runs started in the same second must not write one ``metrics.jsonl``, ``summary.json`` or
``checkpoints/``. :func:`new_run_dir` creates the directory itself with ``mkdir`` (which fails
when it exists, also when another process made it a moment earlier) and takes the next
suffix on a clash. :func:`claim_run_dir` is for a directory the user named: it refuses one that
holds a run already, and claims it by creating its ``logs/`` exclusively.
"""

from __future__ import annotations

import time
from pathlib import Path

from atroposlib.errors import ConfigError

#: Where runs go when no run directory is named.
RUNS_ROOT = "runs"
#: Entries a run writes into its directory; any of them means the directory holds a run.
RUN_MARKERS = ("logs", "summary.json", "metrics.jsonl", "trainer_config.json", "checkpoints",
               "placement.json")
#: How many directories of one second :func:`new_run_dir` tries before giving up.
MAX_PER_SECOND = 1000


def new_run_dir(root: str | Path = RUNS_ROOT, now: float | None = None) -> Path:
    """Create and return a new, empty run directory ``<root>/<UTC timestamp>``.

    The name is ``YYYYmmdd-HHMMSS`` (UTC); when a run of the same second has it (on this host or
    another one sharing ``root``), ``-2``, ``-3``, ... are appended. Each candidate is created
    with ``mkdir`` that fails on an existing directory, so concurrent callers never get the
    same one.

    Args:
        root: the directory runs go under (created if missing).
        now: the time to name the run after, in seconds since the epoch (default: now).

    Returns:
        The new directory (relative when ``root`` is).

    Raises:
        ConfigError: ``MAX_PER_SECOND`` directories of that second exist already.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    for n in range(1, MAX_PER_SECOND + 1):
        path = root / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise ConfigError(f"{root} has {MAX_PER_SECOND} run directories named {stamp}[-N] already; "
                      "name one with --run-dir")


def held_run_files(path: str | Path) -> list[str]:
    """The entries of :data:`RUN_MARKERS` that ``path`` holds (empty: no run wrote there)."""
    path = Path(path)
    return [name for name in RUN_MARKERS if (path / name).exists()]


def claim_run_dir(path: str | Path) -> Path:
    """Take the directory ``path`` that a user named for a new run.

    The directory may exist (empty, or with files of its own), but must hold no run: it is
    claimed by creating ``logs/`` in it exclusively, so of two runs naming one directory at
    once only one gets it.

    Args:
        path: the run directory (created with its parents if missing).

    Returns:
        ``path``, with an empty ``logs/`` in it.

    Raises:
        ConfigError: ``path`` holds a run already (the message names what it holds and how to
            start elsewhere), or is a file.
    """
    path = Path(path)
    fix = (f"name another directory (--run-dir), remove {path}, or leave run_dir unset for a "
           f"new {RUNS_ROOT}/<UTC timestamp>")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"run directory {path} is a file; {fix}")
    held = held_run_files(path)
    if held:
        raise ConfigError(f"run directory {path} holds a run already ({', '.join(held)}); "
                          f"each run needs its own: {fix}")
    path.mkdir(parents=True, exist_ok=True)
    try:
        (path / "logs").mkdir()
    except FileExistsError:
        raise ConfigError(f"run directory {path} was just taken by another run; {fix}") from None
    return path
