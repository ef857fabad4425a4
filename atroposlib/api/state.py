"""ApiState: the trajectory API's state, one object per app, made of four parts that share one core.

* :class:`~atroposlib.api.core.StateCore`: the store and its in-memory index (queue, envs,
  step, buffers);
* :class:`~atroposlib.api.registry.Registry`: trainer and env registration, reset;
* :class:`~atroposlib.api.ingestion.Ingestion`: accepting scored groups;
* :class:`~atroposlib.api.batching.Batching`: choosing and serving batches, the step;
* :class:`~atroposlib.api.views.Views`: status and observe answers.

All methods are synchronous and never await, and the routes call them from ``async def``
handlers on the single event loop, so each request is applied atomically (as in Atropos 0.4).
Every mutation is one store transaction (see :mod:`atroposlib.api.store`), committed before the
handler answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from atroposlib.api.batching import Batching
from atroposlib.api.core import EnvRecord, StateCore
from atroposlib.api.ingestion import Ingestion
from atroposlib.api.metrics import ApiMetrics
from atroposlib.api.models import RegisterEnv, Registration, ScoredData
from atroposlib.api.registry import Registry
from atroposlib.api.settings import ApiSettings
from atroposlib.api.store import GroupMeta, MemoryStore, PartialMeta, SqliteStore
from atroposlib.api.views import Views

__all__ = ["ApiState"]


class ApiState:
    """The server's state; one instance per app (see :func:`atroposlib.api.factory.build_app`).

    A facade: each public method is one route's job, done by the part that owns it.
    """

    def __init__(self, settings: ApiSettings | None = None, store: MemoryStore | SqliteStore | None = None):
        """Open the store named by ``settings.db`` (or use ``store``) and load what it holds."""
        self.core = StateCore(settings or ApiSettings(), store)
        self.registry = Registry(self.core)
        self.ingestion = Ingestion(self.core)
        self.batching = Batching(self.core)
        self.views = Views(self.core)

    # ------------------------------------------------------------------ the core, read-only
    @property
    def settings(self) -> ApiSettings:
        """The server's settings."""
        return self.core.settings

    @property
    def store(self) -> MemoryStore | SqliteStore:
        """The store holding the payloads (memory or SQLite)."""
        return self.core.store

    @property
    def step(self) -> int:
        """The step of the last served batch (``starting_step`` before any)."""
        return self.core.step

    @property
    def started(self) -> bool:
        """True once the trainer polled ``/batch`` (envs may register from then on)."""
        return self.core.started

    @property
    def registration(self) -> Registration | None:
        """The trainer's registration, or None before ``/register``."""
        return self.core.registration

    @property
    def envs(self) -> list[EnvRecord]:
        """The registered envs, by env id."""
        return self.core.envs

    @property
    def queue(self) -> dict[int, GroupMeta]:
        """Queued groups' metadata by id, oldest first."""
        return self.core.queue

    @property
    def partials(self) -> dict[int, list[PartialMeta]]:
        """Buffered partial groups' metadata, per env id."""
        return self.core.partials

    @property
    def buffered_groups(self) -> int:
        """Partial groups waiting to be merged, over all envs."""
        return self.core.buffered_groups

    @property
    def metrics(self) -> ApiMetrics:
        """The app's Prometheus metrics (``GET /metrics``)."""
        return self.core.metrics

    @property
    def max_staleness(self) -> int | None:
        """Staleness limit in force: the trainer's registered ``max_staleness``, else the flag's."""
        return self.core.max_staleness

    def close(self) -> None:
        """Close the store (flushes SQLite)."""
        self.core.close()

    # ------------------------------------------------------------------ registration
    def register(self, reg: Registration) -> dict[str, Any]:
        """``POST /register``: see :meth:`Registry.register`."""
        return self.registry.register(reg)

    def register_env(self, req: RegisterEnv) -> dict[str, Any]:
        """``POST /register-env``: see :meth:`Registry.register_env`."""
        return self.registry.register_env(req)

    def disconnect_env(self, env_id: int) -> dict[str, Any]:
        """``POST /disconnect-env``: see :meth:`Registry.disconnect_env`."""
        return self.registry.disconnect_env(env_id)

    def reset(self) -> None:
        """``/reset_data``: see :meth:`Registry.reset`."""
        self.registry.reset()

    # ------------------------------------------------------------------ ingestion
    def ingest(self, groups: list[ScoredData],
               remember: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
        """``POST /scored_data(_list)``: see :meth:`Ingestion.ingest`."""
        return self.ingestion.ingest(groups, remember)

    def ingest_once(self, key: str, fingerprint: str, groups: list[ScoredData],
                    render: Callable[[list[dict[str, Any]]], bytes]) -> tuple[bytes, bool]:
        """The same with an ``Idempotency-Key``: see :meth:`Ingestion.ingest_once`."""
        return self.ingestion.ingest_once(key, fingerprint, groups, render)

    # ------------------------------------------------------------------ batches
    def next_batch(self) -> tuple[bytes | None, dict[str, Any]]:
        """``GET /batch``: see :meth:`Batching.next_batch`."""
        return self.batching.next_batch()

    def batch_for_step(self, step: int) -> tuple[bytes | None, dict[str, Any]]:
        """``GET /batch?step=N``: see :meth:`Batching.batch_for_step`."""
        return self.batching.batch_for_step(step)

    # ------------------------------------------------------------------ reads
    def status(self, ledger: bool = False) -> dict[str, Any]:
        """``GET /status``: see :meth:`Views.status`."""
        return self.views.status(ledger)

    def ledger(self, entries: int = 0, after: int = 0) -> dict[str, Any]:
        """``GET /ledger``: see :meth:`Views.ledger`."""
        return self.views.ledger(entries, after)

    def status_env(self, env_id: int) -> dict[str, Any]:
        """``GET /status-env``: see :meth:`Views.status_env`."""
        return self.views.status_env(env_id)

    def info(self) -> dict[str, int]:
        """``GET /info``: see :meth:`Views.info`."""
        return self.views.info()

    def wandb_info(self) -> dict[str, str | None]:
        """``GET /wandb_info``: see :meth:`Views.wandb_info`."""
        return self.views.wandb_info()

    def latest_example(self) -> bytes:
        """``GET /latest_example``: see :meth:`Views.latest_example`."""
        return self.views.latest_example()

    def observe(self, after: int, limit: int, env_id: int | None = None) -> bytes:
        """``GET /observe``: see :meth:`Views.observe`."""
        return self.views.observe(after, limit, env_id)
