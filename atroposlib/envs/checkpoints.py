"""Env checkpoints: small JSON files of env state, one per trainer step.

Layout: ``{checkpoint_dir}/env_checkpoints/{name}/step-{step}.json``. Pure functions, and
:class:`CheckpointMixin`, whose ``save_checkpoint``/``load_checkpoint`` ``BaseEnv`` inherits.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


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


class CheckpointMixin:
    """``BaseEnv``'s checkpoint hooks: env state as JSON, one file per trainer step.

    Reads what ``BaseEnv`` sets: ``name`` and the run state's ``wandb_prepend``,
    ``checkpoint_dir`` and ``curr_step``; ``load_checkpoint`` sets attributes on the env.
    """

    def _checkpoint_path(self, step: int) -> Path | None:
        name = self.wandb_prepend or self.name or "env"
        return checkpoint_path(self.checkpoint_dir, name, step)

    def save_checkpoint(self, step: int, data: dict[str, Any] | None = None) -> None:
        """Write ``data`` as JSON to ``{checkpoint_dir}/env_checkpoints/{name}/step-{step}.json``.

        Subclasses call ``super().save_checkpoint(step, {"iter": self.iter})``. Nothing is
        written when ``data`` is None or no checkpoint dir is known.
        """
        path = self._checkpoint_path(step)
        if data is not None and path is not None:
            write_checkpoint(path, data)

    def load_checkpoint(self) -> None:
        """Restore attributes from the newest checkpoint at or before ``curr_step``."""
        path = self._checkpoint_path(self.curr_step)
        found = None if path is None else newest_checkpoint(path.parent, self.curr_step)
        if found is None:
            return
        step, best = found
        for key, value in read_checkpoint(best).items():
            setattr(self, key, value)
        logger.info("loaded env checkpoint %s (step %d)", best, step)


__all__ = [
    "CheckpointMixin",
    "checkpoint_path",
    "newest_checkpoint",
    "read_checkpoint",
    "write_checkpoint",
]
