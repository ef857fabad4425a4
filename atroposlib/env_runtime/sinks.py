"""Output sinks: where accepted groups go (a JSONL file, W&B, the API outbox).

Every sink has the same two methods (:class:`Sink`); a runner builds the ones a run needs,
puts them on the env's run state, and closes them when the run ends.
"""

from __future__ import annotations

import asyncio
import logging
import random
import string
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from atroposlib.envs.base import BaseEnv

logger = logging.getLogger(__name__)


@runtime_checkable
class Sink(Protocol):
    """Somewhere accepted groups are written."""

    async def write(self, group: dict[str, Any], item: Any = None) -> None:
        """Take one accepted group (``item``: the item it came from, when known)."""

    async def close(self) -> None:
        """Flush and release resources; further writes are errors."""


def dedup_path(path: Path) -> Path:
    """``x.jsonl`` if free, else ``x_1.jsonl``, ``x_2.jsonl`` ... (never overwrites a run)."""
    if not path.exists():
        return path
    k = 1
    while True:
        candidate = path.with_name(f"{path.stem}_{k}{path.suffix}")
        if not candidate.exists():
            return candidate
        k += 1


class JsonlSink:
    """Appends one group per line to a JSONL file (created, with its folder, on first write)."""

    def __init__(self, path: str | Path):
        """Args: path: the file; when it exists, ``_1``, ``_2`` ... is appended to the stem."""
        self.path = dedup_path(Path(path))
        self._file: Any = None
        self.written = 0

    async def write(self, group: dict[str, Any], item: Any = None) -> None:
        """Append ``group`` as one JSON line and flush (a crash loses at most that line)."""
        from atroposlib.utils.io import dumps_line

        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._file.write(dumps_line(group))
        self._file.flush()
        self.written += 1

    async def close(self) -> None:
        """Close the file (a later write reopens it in append mode)."""
        if self._file is not None:
            self._file.close()
            self._file = None


class WandbSink:
    """A W&B run for the env; each accepted group goes to the env's rollout table.

    Metrics are logged by the env's ``wandb_log`` hook (into the active run); this sink starts
    and finishes the run and feeds ``env.add_rollouts_for_wandb``. A failed ``wandb.init``
    is logged once and the sink does nothing afterwards (metrics must not stop data generation).
    """

    def __init__(self, env: BaseEnv):
        self.env = env
        self.run: Any = None
        self.failed = False

    def start(self, project: str | None = None, group: str | None = None) -> None:
        """Start the W&B run named ``<wandb_name or env name>-<date>-<random>`` (once)."""
        if self.run is not None or self.failed:
            return
        import wandb

        base = self.env.config.wandb_name or self.env.name or "env"
        suffix = "".join(random.choices(string.ascii_lowercase, k=6))
        try:
            self.run = wandb.init(
                project=project,
                group=group,
                name=f"{base}-{time.strftime('%Y-%m-%d')}-{suffix}",
                config=self.env.config.model_dump(mode="json"),
                reinit="finish_previous",
            )
        except Exception as exc:  # noqa: BLE001 - metrics must not stop data generation
            self.failed = True
            logger.warning(
                "W&B init failed (%s); continuing without W&B. Log in (`wandb login`), set "
                "WANDB_MODE=offline, or pass --env.use_wandb false",
                exc,
            )

    async def write(self, group: dict[str, Any], item: Any = None) -> None:
        """Keep some of the group's rollouts for the ``train/rollouts`` table."""
        if self.run is not None:
            self.env.add_rollouts_for_wandb(group, item)

    async def close(self) -> None:
        """Finish the W&B run."""
        if self.run is not None:
            self.run.finish()
            self.run = None


class OutboxSink:
    """A bounded queue of groups for the API; the serve loop's sender drains it.

    ``write`` waits while the queue is full, so rollouts pause instead of losing groups during
    an API outage.
    """

    def __init__(self, maxsize: int):
        """Args: maxsize: groups held before ``write`` waits (> 0)."""
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=maxsize)

    async def write(self, group: dict[str, Any], item: Any = None) -> None:
        """Queue ``group`` for sending (waits while the outbox is full)."""
        await self.queue.put(group)

    async def close(self) -> None:
        """Nothing to release; the serve loop flushes the queue at shutdown."""


def local_sinks(env: BaseEnv) -> list[Sink]:
    """The sinks the env's config asks for (JSONL, W&B).

    A :class:`JsonlSink` for ``data_path_to_save_groups`` and a :class:`WandbSink` (not started
    yet) for ``use_wandb``.
    """
    sinks: list[Sink] = []
    if env.config.data_path_to_save_groups:
        sinks.append(JsonlSink(env.config.data_path_to_save_groups))
    if env.config.use_wandb:
        sinks.append(WandbSink(env))
    return sinks


def find_sink(sinks: list[Any], kind: type) -> Any:
    """The first sink of type ``kind`` in ``sinks``, or None."""
    return next((s for s in sinks if isinstance(s, kind)), None)


async def close_sinks(sinks: list[Any]) -> None:
    """Close every sink; one failing to close is logged and does not stop the others."""
    for sink in sinks:
        try:
            await sink.close()
        except Exception:  # noqa: BLE001 - best effort on the way out
            logger.exception("closing %s failed", type(sink).__name__)


__all__ = ["JsonlSink", "OutboxSink", "Sink", "WandbSink", "close_sinks", "dedup_path", "find_sink", "local_sinks"]
