"""Storage of the API's state: in memory, or durable in SQLite (``run-api --db PATH``).

The :class:`~atroposlib.api.state.ApiState` keeps the small metadata of every group in memory
(id, env, sizes) and asks a store for the group payloads (compact blobs, see
:mod:`atroposlib.api.codec`) only when it serves or shows them. :class:`MemoryStore` keeps the
blobs in a dict; :class:`SqliteStore` keeps them on disk, so with ``--db`` the server's memory
does not grow with the queue.

SQLite runs in WAL mode. ``synchronous=NORMAL`` (the default) makes every committed transaction
survive a crash or ``kill -9`` of the server (the WAL is in the OS page cache); only power loss or
an OS crash can lose the last commits. ``synchronous=FULL`` fsyncs every commit and survives those
too, at the cost of one fsync per accepted POST. Every mutating request is one transaction that
commits before the response is sent, so a 200 means "stored". Serving a batch marks its groups
served in the same transaction that advances the step, so after a restart nothing is served twice.
The answers to recent POSTs that carried an ``Idempotency-Key`` are stored in the transaction
that stores their groups, so a retried POST is answered from the store, not stored again. The
last served batches (their group ids in batch order, by step) are stored with the step, so
``GET /batch?step=N`` can answer them again after a restart.
"""

from __future__ import annotations

import contextlib
import errno
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from atroposlib.api.ledger import MemoryJournal, SqliteJournal
from atroposlib.errors import AtroposError

__all__ = ["GroupMeta", "IdempotentReply", "MemoryStore", "PartialMeta", "Snapshot", "SqliteStore",
           "StoreFullError", "open_store"]


class StoreFullError(AtroposError):
    """The store could not write (its disk is full, or refused a write); nothing was changed."""


def _is_full(exc: BaseException) -> bool:
    """True for a failed write: SQLite's SQLITE_FULL or SQLITE_IOERR*, or an OS ``ENOSPC``."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        return code is not None and code & 0xFF in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR)
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC


@dataclass(slots=True)
class GroupMeta:
    """What the server keeps in memory about one stored group (the payload stays in the store).

    Attributes:
        id: the group's cursor (monotonic across resets and restarts).
        env_id: sender's env id, or None.
        n_seqs: sequences in the group (its size).
        n_tokens: total tokens over its sequences.
        received_at: UNIX time it entered the queue.
        served_step: the step whose batch contained it; None while queued.
        policy_version: trainer step of the weights that generated it, or None (never stale).
        ledger_tokens: its completion tokens, as the ledger counts them (0 for a group stored
            before the ledger existed, which the ledger never counted as sampled either).
    """

    id: int
    env_id: int | None
    n_seqs: int
    n_tokens: int
    received_at: float
    served_step: int | None = None
    policy_version: int | None = None
    ledger_tokens: int = 0


@dataclass(slots=True)
class PartialMeta:
    """A buffered partial group waiting to be merged into a full group of ``target`` sequences.

    ``policy_version`` and ``ledger_tokens`` are as in :class:`GroupMeta`.
    """

    id: int
    env_id: int
    target: int
    signature: str
    n_seqs: int
    n_tokens: int
    received_at: float
    policy_version: int | None = None
    ledger_tokens: int = 0


@dataclass(slots=True)
class IdempotentReply:
    """The remembered answer to a POST that carried an ``Idempotency-Key``.

    Attributes:
        key: the client's key, prefixed by the route path (``"/scored_data key"``).
        seq: insertion order (the oldest are forgotten first).
        fingerprint: hash of the request body, to refuse a key reused for another body.
        reply: the JSON answer that was sent (bytes).
    """

    key: str
    seq: int
    fingerprint: str
    reply: bytes


@dataclass
class Snapshot:
    """Everything a store holds except payload blobs (read once at start-up)."""

    meta: dict[str, Any] = field(default_factory=dict)
    envs: list[dict[str, Any]] = field(default_factory=list)
    groups: list[GroupMeta] = field(default_factory=list)
    partials: list[PartialMeta] = field(default_factory=list)
    replies: list[IdempotentReply] = field(default_factory=list)
    #: (step, group ids in batch order) of the served batches kept for replay, oldest first
    batches: list[tuple[int, list[int]]] = field(default_factory=list)


class MemoryStore:
    """Process-memory store (the default): lost when the server stops.

    Transactions are all or none, as in SQLite: every write inside :meth:`transaction` records
    how to undo itself, and an exception in the block undoes them all, newest first.
    """

    durable = False

    def __init__(self) -> None:
        self._meta: dict[str, Any] = {}
        self._envs: dict[int, dict[str, Any]] = {}
        self._groups: dict[int, tuple[GroupMeta, bytes]] = {}
        self._partials: dict[int, tuple[PartialMeta, bytes]] = {}
        self._undo: list[Callable[[], None]] | None = None
        self._replies: dict[str, IdempotentReply] = {}
        self._batches: dict[int, list[int]] = {}
        #: the run ledger's journal (totals and the newest entries)
        self.journal = MemoryJournal(lambda: self._undo)

    def load(self) -> Snapshot:
        """Return the current contents (metadata only, copies: the caller may change them)."""
        return Snapshot(
            dict(self._meta),
            [self._envs[k] for k in sorted(self._envs)],
            [replace(m) for m, _ in self._groups.values()],
            [replace(m) for m, _ in self._partials.values()],
            sorted(self._replies.values(), key=lambda r: r.seq),
            [(step, list(ids)) for step, ids in sorted(self._batches.items())],
        )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Run the block all or none (nested blocks join the outer one)."""
        if self._undo is not None:
            yield
            return
        self._undo = []
        try:
            yield
        except BaseException:
            for undo in reversed(self._undo):
                undo()
            raise
        finally:
            self._undo = None

    def _remember(self, table: dict, key: Any) -> None:
        """Record how to restore ``table[key]`` (when inside a transaction)."""
        if self._undo is None:
            return
        if key in table:
            old = table[key]
            self._undo.append(lambda: table.__setitem__(key, old))
        else:
            self._undo.append(lambda: table.pop(key, None))

    def set_meta(self, key: str, value: Any) -> None:
        """Store a small JSON-able value (registration, step, ...)."""
        self._remember(self._meta, key)
        self._meta[key] = value

    def put_env(self, env_id: int, record: dict[str, Any]) -> None:
        """Insert or replace an env record."""
        self._remember(self._envs, env_id)
        self._envs[env_id] = record

    def put_group(self, meta: GroupMeta, blob: bytes) -> None:
        """Store a queued group."""
        self._remember(self._groups, meta.id)
        self._groups[meta.id] = (replace(meta), blob)  # a copy: the state's own may change

    def group_blobs(self, ids: Iterable[int]) -> dict[int, bytes]:
        """Return ``{id: blob}`` for the given group ids."""
        return {i: self._groups[i][1] for i in ids}

    def mark_served(self, ids: Iterable[int], step: int) -> None:
        """Record that these groups went out in the batch of ``step``."""
        for i in ids:
            meta = self._groups[i][0]
            if self._undo is not None:
                self._undo.append(lambda meta=meta, old=meta.served_step: setattr(meta, "served_step", old))
            meta.served_step = step

    def delete_groups(self, ids: Iterable[int]) -> None:
        """Forget served groups that left the observe retention window."""
        for i in ids:
            self._remember(self._groups, i)
            self._groups.pop(i, None)

    def put_partial(self, meta: PartialMeta, blob: bytes) -> None:
        """Store a buffered partial group."""
        self._remember(self._partials, meta.id)
        self._partials[meta.id] = (replace(meta), blob)

    def partial_blobs(self, ids: Iterable[int]) -> dict[int, bytes]:
        """Return ``{id: blob}`` for the given partial ids."""
        return {i: self._partials[i][1] for i in ids}

    def delete_partials(self, ids: Iterable[int]) -> None:
        """Remove partials (merged or flushed into the queue)."""
        for i in ids:
            self._remember(self._partials, i)
            self._partials.pop(i, None)

    def put_batch(self, step: int, ids: list[int]) -> None:
        """Keep the group ids (in batch order) of the batch served as ``step``."""
        self._remember(self._batches, step)
        self._batches[step] = list(ids)

    def delete_batches(self, steps: Iterable[int]) -> None:
        """Forget kept batches (past the replay window, or after a renumbering)."""
        for step in steps:
            self._remember(self._batches, step)
            self._batches.pop(step, None)

    def put_reply(self, reply: IdempotentReply) -> None:
        """Remember the answer to an idempotent POST."""
        self._remember(self._replies, reply.key)
        self._replies[reply.key] = reply

    def delete_replies(self, keys: Iterable[str]) -> None:
        """Forget remembered answers (the oldest, past the bound)."""
        for key in keys:
            self._remember(self._replies, key)
            self._replies.pop(key, None)

    def reset(self) -> None:
        """Drop everything (``/reset_data``)."""
        if self._undo is not None:
            tables = (self._meta, self._envs, self._groups, self._partials, self._replies,
                      self._batches)
            saved = [(t, dict(t)) for t in tables]
            self._undo.append(lambda: [t.update(old) for t, old in saved])
        self._meta.clear()
        self._envs.clear()
        self._groups.clear()
        self._partials.clear()
        self._replies.clear()
        self._batches.clear()
        self.journal.reset()

    def close(self) -> None:
        """Nothing to release."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS envs (id INTEGER PRIMARY KEY, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS groups (
    id INTEGER PRIMARY KEY, env_id INTEGER, n_seqs INTEGER NOT NULL, n_tokens INTEGER NOT NULL,
    received_at REAL NOT NULL, served_step INTEGER, policy_version INTEGER);
-- payloads apart from the metadata: marking a group served must not rewrite its blob
CREATE TABLE IF NOT EXISTS group_blobs (id INTEGER PRIMARY KEY, blob BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS partials (
    id INTEGER PRIMARY KEY, env_id INTEGER NOT NULL, target INTEGER NOT NULL,
    signature TEXT NOT NULL, n_seqs INTEGER NOT NULL, n_tokens INTEGER NOT NULL,
    received_at REAL NOT NULL, blob BLOB NOT NULL, policy_version INTEGER);
-- answers to POSTs that carried an Idempotency-Key (bounded: the oldest are deleted)
CREATE TABLE IF NOT EXISTS replies (
    key TEXT PRIMARY KEY, seq INTEGER NOT NULL, fingerprint TEXT NOT NULL, reply BLOB NOT NULL);
-- served batches kept for GET /batch?step=N: group ids in batch order (JSON), by step
CREATE TABLE IF NOT EXISTS batches (step INTEGER PRIMARY KEY, ids BLOB NOT NULL);
"""
#: 2 added the policy_version columns (a version-1 file gets them on open); 3 the batches
#: table (a version-2 file's last batch, kept in meta, is read as the one kept batch); 4 the
#: ledger table and the ledger_tokens columns (0 for the groups of an older file).
_SCHEMA_VERSION = 4


def _chunks(ids: Iterable[int], size: int = 500) -> Iterator[list[int]]:
    batch: list[int] = []
    for i in ids:
        batch.append(i)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class SqliteStore:
    """Durable store in one SQLite file (WAL journal); see the module docstring for guarantees."""

    durable = True

    def __init__(self, path: str | Path, synchronous: str = "NORMAL"):
        """Open (or create) the database.

        Args:
            path: the SQLite file; its directory is created if missing.
            synchronous: ``"NORMAL"`` or ``"FULL"`` (see the module docstring).

        Raises:
            ValueError: the file is locked by another server, or was written by a newer,
                incompatible schema.
        """
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                   timeout=0.5)
        # one server per file: a second run-api on the same --db would serve the same groups
        self._db.execute("PRAGMA locking_mode=EXCLUSIVE")
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            self._db.close()
            raise ValueError(
                f"cannot lock {self.path} ({exc}): another run-api is probably using this --db; "
                "stop it or pass a different --db file"
            ) from exc
        self._db.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'FULL' else 'NORMAL'}")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > _SCHEMA_VERSION:
            raise ValueError(
                f"{self.path} has schema version {version}, newer than this atroposlib "
                f"({_SCHEMA_VERSION}); upgrade atroposlib or use another --db file"
            )
        self._db.executescript(_SCHEMA)
        for table in ("groups", "partials"):
            columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if "policy_version" not in columns:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN policy_version INTEGER")
            if "ledger_tokens" not in columns:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN ledger_tokens INTEGER "
                                 "NOT NULL DEFAULT 0")
        #: the run ledger's journal (the ledger table, written in this store's transactions)
        self.journal = SqliteJournal(self._db)
        self._db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        self._depth = 0

    def load(self) -> Snapshot:
        """Read all metadata (no payloads)."""
        db = self._db
        return Snapshot(
            {k: orjson.loads(v) for k, v in db.execute("SELECT key, value FROM meta")},
            [orjson.loads(r) for (r,) in db.execute("SELECT record FROM envs ORDER BY id")],
            [
                GroupMeta(*row)
                for row in db.execute(
                    "SELECT id, env_id, n_seqs, n_tokens, received_at, served_step, "
                    "policy_version, ledger_tokens FROM groups ORDER BY id"
                )
            ],
            [
                PartialMeta(*row)
                for row in db.execute(
                    "SELECT id, env_id, target, signature, n_seqs, n_tokens, received_at, "
                    "policy_version, ledger_tokens FROM partials ORDER BY id"
                )
            ],
            [
                IdempotentReply(*row)
                for row in db.execute("SELECT key, seq, fingerprint, reply FROM replies ORDER BY seq")
            ],
            [(step, orjson.loads(ids))
             for step, ids in db.execute("SELECT step, ids FROM batches ORDER BY step")],
        )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Run the block as one transaction (nested blocks join the outer one).

        Raises:
            StoreFullError: a write or the commit failed for lack of space (or an I/O error);
                the transaction was rolled back, so the file holds what it held before.
        """
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._depth = 1
        try:
            self._db.execute("BEGIN IMMEDIATE")
            yield
            self._db.execute("COMMIT")
        except BaseException as exc:
            if self._db.in_transaction:  # a failed COMMIT may leave it open
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            if _is_full(exc):
                raise StoreFullError(f"cannot write {self.path}: {exc}") from exc
            raise
        finally:
            self._depth = 0

    def set_meta(self, key: str, value: Any) -> None:
        """Store a small JSON-able value (registration, step, ...)."""
        self._db.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, orjson.dumps(value))
        )

    def put_env(self, env_id: int, record: dict[str, Any]) -> None:
        """Insert or replace an env record."""
        self._db.execute(
            "INSERT OR REPLACE INTO envs (id, record) VALUES (?, ?)", (env_id, orjson.dumps(record))
        )

    def put_group(self, meta: GroupMeta, blob: bytes) -> None:
        """Store a queued group."""
        self._db.execute(
            "INSERT INTO groups (id, env_id, n_seqs, n_tokens, received_at, served_step, "
            "policy_version, ledger_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (meta.id, meta.env_id, meta.n_seqs, meta.n_tokens, meta.received_at, meta.served_step,
             meta.policy_version, meta.ledger_tokens),
        )
        self._db.execute("INSERT INTO group_blobs VALUES (?, ?)", (meta.id, blob))

    def group_blobs(self, ids: Iterable[int]) -> dict[int, bytes]:
        """Return ``{id: blob}`` for the given group ids."""
        out: dict[int, bytes] = {}
        for chunk in _chunks(ids):
            marks = ",".join("?" * len(chunk))
            out.update(
                self._db.execute(f"SELECT id, blob FROM group_blobs WHERE id IN ({marks})", chunk)
            )
        return out

    def mark_served(self, ids: Iterable[int], step: int) -> None:
        """Record that these groups went out in the batch of ``step``."""
        for chunk in _chunks(ids):
            marks = ",".join("?" * len(chunk))
            self._db.execute(
                f"UPDATE groups SET served_step = ? WHERE id IN ({marks})", [step, *chunk]
            )

    def delete_groups(self, ids: Iterable[int]) -> None:
        """Forget served groups that left the observe retention window."""
        for chunk in _chunks(ids):
            marks = ",".join("?" * len(chunk))
            self._db.execute(f"DELETE FROM groups WHERE id IN ({marks})", chunk)
            self._db.execute(f"DELETE FROM group_blobs WHERE id IN ({marks})", chunk)

    def put_partial(self, meta: PartialMeta, blob: bytes) -> None:
        """Store a buffered partial group."""
        self._db.execute(
            "INSERT INTO partials (id, env_id, target, signature, n_seqs, n_tokens, received_at, "
            "blob, policy_version, ledger_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (meta.id, meta.env_id, meta.target, meta.signature, meta.n_seqs, meta.n_tokens,
             meta.received_at, blob, meta.policy_version, meta.ledger_tokens),
        )

    def partial_blobs(self, ids: Iterable[int]) -> dict[int, bytes]:
        """Return ``{id: blob}`` for the given partial ids."""
        out: dict[int, bytes] = {}
        for chunk in _chunks(ids):
            marks = ",".join("?" * len(chunk))
            out.update(self._db.execute(f"SELECT id, blob FROM partials WHERE id IN ({marks})", chunk))
        return out

    def delete_partials(self, ids: Iterable[int]) -> None:
        """Remove partials (merged or flushed into the queue)."""
        for chunk in _chunks(ids):
            self._db.execute(f"DELETE FROM partials WHERE id IN ({','.join('?' * len(chunk))})", chunk)

    def put_batch(self, step: int, ids: list[int]) -> None:
        """Keep the group ids (in batch order) of the batch served as ``step``."""
        self._db.execute("INSERT OR REPLACE INTO batches VALUES (?, ?)", (step, orjson.dumps(ids)))

    def delete_batches(self, steps: Iterable[int]) -> None:
        """Forget kept batches (past the replay window, or after a renumbering)."""
        self._db.executemany("DELETE FROM batches WHERE step = ?", [(s,) for s in steps])

    def put_reply(self, reply: IdempotentReply) -> None:
        """Remember the answer to an idempotent POST."""
        self._db.execute("INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?)",
                         (reply.key, reply.seq, reply.fingerprint, reply.reply))

    def delete_replies(self, keys: Iterable[str]) -> None:
        """Forget remembered answers (the oldest, past the bound)."""
        self._db.executemany("DELETE FROM replies WHERE key = ?", [(k,) for k in keys])

    def reset(self) -> None:
        """Drop everything (``/reset_data``)."""
        for table in ("meta", "envs", "groups", "group_blobs", "partials", "replies", "batches"):
            self._db.execute(f"DELETE FROM {table}")
        self.journal.reset()

    def close(self) -> None:
        """Checkpoint the WAL and close the file."""
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._db.close()


def open_store(db: str | Path | None, synchronous: str = "NORMAL") -> MemoryStore | SqliteStore:
    """Return a :class:`SqliteStore` for ``db``, or a :class:`MemoryStore` when ``db`` is None."""
    return SqliteStore(db, synchronous) if db else MemoryStore()
