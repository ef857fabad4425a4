"""What every benchmark result file records about its run: command, git sha, machine, date.

``run_info(argv)`` returns a dict to put at the top of a result JSON, so a figure can be traced
to the commit and machine that measured it. Nothing here imports torch or reaches the network.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git_sha(repo: Path = ROOT) -> str | None:
    """The commit checked out in ``repo`` (40 hex digits), or None when it is not a git work tree."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_dirty(repo: Path = ROOT) -> bool | None:
    """Whether tracked files of ``repo`` differ from its commit (None: not a git work tree)."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


def _ram_gib() -> float | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def machine() -> dict:
    """CPU cores, RAM (GiB), GPU names (empty list: none), OS and Python of this machine."""
    return {"cpus": os.cpu_count(), "ram_gib": _ram_gib(), "gpus": _gpus(),
            "platform": platform.platform(), "python": platform.python_version()}


def run_info(argv: list[str] | None = None) -> dict:
    """The run's provenance for a result file.

    Args:
        argv: the command line (default ``sys.argv``); recorded as ``python ARGV...``.

    Returns:
        ``{"command", "git_sha", "git_dirty", "machine", "date"}``; ``date`` is UTC, ISO 8601.
    """
    argv = list(sys.argv if argv is None else argv)
    if argv:
        script = Path(argv[0]).resolve()
        if script.is_relative_to(ROOT):
            argv[0] = str(script.relative_to(ROOT))
    return {
        "command": shlex.join(["python", *argv]),
        "git_sha": git_sha(),
        "git_dirty": git_dirty(),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
