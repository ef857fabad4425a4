"""StateCore: the API's in-memory index of its store, shared by the registry, ingestion, batching and views.

The store (see :mod:`atroposlib.api.store`) holds every group's payload; the core keeps what
the server needs to decide without reading payloads: the registration, the step, the env
registry, the queue (group metadata), the served groups kept for ``/observe``, the partial-group
buffers and the remembered idempotent answers. :meth:`StateCore.load` rebuilds it all from the
store (at start-up, after ``/reset_data`` and after a failed transaction).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from atroposlib.api.errors import InsufficientStorageError, UnknownEnvError
from atroposlib.api.ledger import LedgerEntry, LedgerTotals, ledger_view
from atroposlib.api.metrics import ApiMetrics
from atroposlib.api.models import Registration
from atroposlib.api.settings import REPLAY_BATCHES_CAP, ApiSettings
from atroposlib.api.store import (
    GroupMeta,
    IdempotentReply,
    MemoryStore,
    PartialMeta,
    SqliteStore,
    StoreFullError,
    open_store,
)

log = logging.getLogger("atroposlib.api")


@dataclass(slots=True)
class EnvRecord:
    """One registered environment (the Atropos 0.4 env record, plus a liveness timestamp).

    Attributes:
        registered_id: the env_id (index in the registry).
        desired_name: the name the env asked for.
        real_name: unique name ``<desired>_<k>`` (its W&B run name).
        max_seq_len: the env's longest sequence in tokens (it registers it as max_token_length).
        weight: sampling weight (feeds ``env_weight``).
        group_size: sequences per group it sends.
        min_batch_allocation: minimum fraction of each batch reserved for it, or None.
        connected: False after ``/disconnect-env``.
        last_update: UNIX time of registration.
        last_seen: monotonic time of its last request (heartbeat; not persisted).
    """

    registered_id: int
    desired_name: str
    real_name: str
    max_seq_len: int
    weight: float
    group_size: int
    min_batch_allocation: float | None
    connected: bool = True
    last_update: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)

    def to_record(self) -> dict[str, Any]:
        """The persisted form (without the in-memory heartbeat)."""
        record = asdict(self)
        record.pop("last_seen")
        return record


class StateCore:
    """The store plus its in-memory index; one per :class:`~atroposlib.api.state.ApiState`."""

    def __init__(self, settings: ApiSettings, store: MemoryStore | SqliteStore | None = None):
        """Open the store named by ``settings.db`` (or use ``store``) and load what it holds."""
        self.settings = settings
        self.store = store or open_store(self.settings.db, self.settings.db_synchronous)
        self.load()
        #: the app's Prometheus metrics (GET /metrics)
        self.metrics = ApiMetrics(self)

    def load(self) -> None:
        """(Re)build the in-memory index from the store."""
        snap = self.store.load()
        meta = snap.meta
        reg = meta.get("registration")
        self.registration: Registration | None = Registration(**reg) if reg else None
        self.step: int = int(meta.get("step", 0))
        self.started: bool = bool(meta.get("started", False))
        self.next_id: int = int(meta.get("next_id", 1))
        self.next_partial_id: int = int(meta.get("next_partial_id", 1))
        now = time.monotonic()
        self.envs: list[EnvRecord] = [EnvRecord(**r, last_seen=now) for r in snap.envs]
        self.groups: dict[int, GroupMeta] = {}
        self.queue: dict[int, GroupMeta] = {}
        self.served: deque[GroupMeta] = deque()
        self.served_tokens = 0
        self.queued_tokens = 0
        self.queued_seqs_by_env: Counter[int | None] = Counter()
        self.queued_size_counts: Counter[int] = Counter()
        for g in snap.groups:
            self.groups[g.id] = g
            self.next_id = max(self.next_id, g.id + 1)
            if g.served_step is None:
                self.index_queued(g)
        for g in sorted((g for g in snap.groups if g.served_step is not None),
                        key=lambda g: (g.served_step, g.id)):
            self.served.append(g)
            self.served_tokens += g.n_tokens
        self.partials: dict[int, list[PartialMeta]] = {}
        self.buffered_tokens = 0
        for p in snap.partials:
            self.partials.setdefault(p.env_id, []).append(p)
            self.buffered_tokens += p.n_tokens
            self.next_partial_id = max(self.next_partial_id, p.id + 1)
        self.latest_id: int | None = max(self.groups) if self.groups else None
        #: groups dropped as too stale, per env id as a string ("null": no env id)
        self.stale_dropped: Counter[str] = Counter(meta.get("stale_dropped", {}))
        #: group ids in batch order of the served batches GET /batch?step=N can answer again,
        #: by step, oldest first (see :attr:`replay_batches`)
        self.batches: OrderedDict[int, list[int]] = OrderedDict(snap.batches)
        last = meta.get("last_batch")  # written by stores of schema 2: their one kept batch
        if last and not self.batches:
            self.batches[int(last["step"])] = list(last["ids"])
        self.replies: OrderedDict[str, IdempotentReply] = OrderedDict(
            (r.key, r) for r in snap.replies)
        self.next_reply_seq = max((r.seq for r in snap.replies), default=0) + 1
        #: the run ledger's totals (the journal's sums; see :mod:`atroposlib.api.ledger`)
        self.ledger: LedgerTotals = self.store.journal.totals()
        self.version = 0
        self.no_batch_key: tuple | None = None
        self.no_batch_reason = ""

    @contextlib.contextmanager
    def transaction(self, what: str) -> Iterator[None]:
        """One store transaction; on failure the in-memory index is rebuilt from the store.

        Code inside may change the index before or while it writes: whatever fails, the
        index goes back to what the store holds (the transaction was rolled back).

        Args:
            what: what the block does, for the log and the error (e.g. "storing scored data").

        Raises:
            InsufficientStorageError: the ``--db`` disk is full (507 with ``Retry-After``);
                nothing was changed, and the same request succeeds once space is freed.
        """
        try:
            with self.store.transaction():
                yield
        except StoreFullError as exc:
            log.error("%s failed, nothing was changed: %s", what, exc)
            self.load()
            raise InsufficientStorageError(
                f"{what} failed: the disk of --db is full ({exc.__cause__ or exc}). Nothing was "
                f"stored or changed; free space on it and retry (after "
                f"{self.settings.retry_after_s} s). Data already accepted is safe.",
                self.settings.retry_after_s) from None
        except Exception:
            log.exception("%s failed; reloading state from the store", what)
            self.load()
            raise

    def index_queued(self, g: GroupMeta) -> None:
        """Add a stored group to the queue's index."""
        self.queue[g.id] = g
        self.queued_tokens += g.n_tokens
        self.queued_seqs_by_env[g.env_id] += g.n_seqs
        self.queued_size_counts[g.n_seqs] += 1

    def unindex_queued(self, g: GroupMeta) -> None:
        """Remove a group from the queue's index (served or dropped)."""
        del self.queue[g.id]
        self.queued_tokens -= g.n_tokens
        self.queued_seqs_by_env[g.env_id] -= g.n_seqs
        self.queued_size_counts[g.n_seqs] -= 1
        if not self.queued_size_counts[g.n_seqs]:
            del self.queued_size_counts[g.n_seqs]

    def record(self, entry: LedgerEntry) -> None:
        """Append ``entry`` to the ledger's journal and totals (inside a :meth:`transaction`)."""
        self.store.journal.append(entry)
        self.ledger.add(entry)

    def ledger_view(self) -> dict[str, Any]:
        """The run ledger with the queue's and the buffers' tokens now (``GET /ledger``)."""
        queued = sum(g.ledger_tokens for g in self.queue.values())
        buffered = sum(p.ledger_tokens for parts in self.partials.values() for p in parts)
        return ledger_view(self.ledger, queued, buffered)

    def close(self) -> None:
        """Close the store (flushes SQLite)."""
        self.store.close()

    @property
    def buffered_groups(self) -> int:
        """Partial groups waiting to be merged, over all envs."""
        return sum(len(v) for v in self.partials.values())

    @property
    def max_staleness(self) -> int | None:
        """Staleness limit in force: the trainer's registered ``max_staleness``, else the flag's."""
        reg = self.registration
        if reg is not None and reg.max_staleness is not None:
            return reg.max_staleness
        return self.settings.max_staleness

    @property
    def replay_batches(self) -> int:
        """How many of the last served batches ``GET /batch?step=N`` can answer again.

        ``--replay-batches`` when given; else the trainer's ``save_checkpoint_interval + 2``
        (the steps after its last checkpoint, the one it was training and one fetched ahead),
        at most :data:`~atroposlib.api.settings.REPLAY_BATCHES_CAP`; else 1 (the last batch).
        """
        if self.settings.replay_batches is not None:
            return self.settings.replay_batches
        reg = self.registration
        if reg is not None and reg.save_checkpoint_interval > 0:
            return min(reg.save_checkpoint_interval + 2, REPLAY_BATCHES_CAP)
        return 1

    @property
    def oldest_replayable_step(self) -> int | None:
        """The oldest step whose batch can be answered again, or None when none is kept."""
        return next(iter(self.batches), None)

    def env(self, env_id: int) -> EnvRecord:
        """Return the registered env ``env_id``.

        Raises:
            UnknownEnvError: no env has that id.
        """
        if 0 <= env_id < len(self.envs):
            return self.envs[env_id]
        known = f"0..{len(self.envs) - 1}" if self.envs else "none"
        raise UnknownEnvError(
            f"env_id {env_id} is not registered (registered ids: {known}). Call POST /register-env "
            "and use the env_id it returns; after /reset_data or a server restart without --db, "
            "envs must register again."
        )

    def is_active(self, env: EnvRecord, now: float) -> bool:
        """True when the env is connected and was heard from within the heartbeat timeout."""
        timeout = self.settings.env_heartbeat_timeout_s
        return env.connected and (not timeout or now - env.last_seen <= timeout)

    def changed(self) -> None:
        """Note a change of the queue or registry (invalidates the cached "no batch" answer)."""
        self.version += 1
