"""Env checkpoints: small JSON files of env state, one per trainer step.

Layout: ``{checkpoint_dir}/env_checkpoints/{name}/step-{step}.json``. ``BaseEnv.save_checkpoint``
and ``BaseEnv.load_checkpoint`` are thin wrappers over these pure functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def checkpoint_path(checkpoint_dir: str | None, name: str, step: int) -> Path | None:
    """Where the checkpoint of ``step`` goes; None when no checkpoint dir is known."""
    if not checkpoint_dir:
        return None
    return Path(checkpoint_dir) / "env_checkpoints" / name / f"step-{step}.json"


def write_checkpoint(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temp file + rename), creating parents.

    Raises:
        TypeError: ``data`` is not JSON-serialisable.
        OSError: the directory cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def newest_checkpoint(directory: Path, max_step: int) -> tuple[int, Path] | None:
    """The ``(step, path)`` of the newest ``step-N.json`` in ``directory`` with ``N <= max_step``.

    Files whose step is not an integer are ignored; None when there is none (or no directory).
    """
    if not directory.is_dir():
        return None
    candidates = []
    for path in directory.glob("step-*.json"):
        try:
            step = int(path.stem.split("-", 1)[1])
        except ValueError:
            continue
        if step <= max_step:
            candidates.append((step, path))
    return max(candidates) if candidates else None


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The JSON object stored at ``path``.

    Raises:
        OSError: it cannot be read.
        json.JSONDecodeError: it is not JSON.
    """
    return json.loads(path.read_text())


__all__ = ["checkpoint_path", "newest_checkpoint", "read_checkpoint", "write_checkpoint"]
