"""The run ledger: an append-only journal of what became of every rollout and token run-api saw.

Every group run-api accepts, every group an env dropped after sampling (reported with its next
group, see :class:`~atroposlib.api.models.EnvDrops`), every group dropped as stale and every
served batch is one journal entry, written in the store transaction that changes the queue. The
journal's totals and the queue therefore agree at every commit, with ``--db`` across a ``kill -9``
too, and two identities close exactly:

* rollouts: ``sampled = completed + masked + failed``. Every attempt of every member counts
  once: a member kept after ``k`` retries is ``k`` failed rollouts and one completed one.
* tokens: ``sampled = served + dropped_stale + dropped_filter + dropped_masked + queued``.
  The trainer splits ``served`` into ``trained + dropped_poison`` (its batch checks).

Tokens are *completion tokens*: the positions of a sequence whose label (the wire's ``masks``)
is not ``-100``, i.e. the tokens a trainer would train on. Prompt tokens are not counted: a
group's prompt is shared by its members and is no sampling cost of theirs. Each token is counted
in exactly one fate: a masked member's tokens (when the env sent its sequence) are
``dropped_masked`` even when its group is dropped later; a failed member has no tokens.

Pure functions compute the entries (:func:`group_entry`, :func:`drops_entry`); the totals are
:class:`LedgerTotals`; :class:`MemoryJournal` and :class:`SqliteJournal` keep the entries
beside the store's own tables (see :mod:`atroposlib.api.store`).
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import orjson

from atroposlib.type_definitions import IGNORE_INDEX

__all__ = ["ENTRY_KINDS", "LedgerEntry", "LedgerTotals", "MemoryJournal", "SqliteJournal",
           "completion_tokens", "drops_entry", "group_entry", "group_counts", "ledger_view"]

#: What a journal entry records: a group accepted (queued or buffered), the groups an env
#: dropped after sampling, a queued group dropped as stale, a served batch.
ENTRY_KINDS = ("group", "env_drops", "stale", "served")


def completion_tokens(masks: Iterable[Iterable[int]] | None) -> int:
    """Completion tokens of a group's rows: labels that are not ``-100`` (``[G][T_i]`` -> int)."""
    return sum(sum(1 for label in row if label != IGNORE_INDEX) for row in masks or ())


def group_counts(group: dict[str, Any]) -> dict[str, int]:
    """Rollouts and completion tokens of one wire group given as a dict (as ``/batch`` serves it).

    The rules of :func:`group_entry`, for readers of plain JSON (the trainer, the env's tally).

    Returns:
        ``{"completed", "masked", "failed", "tokens", "masked_tokens"}``: ``tokens`` are the kept
        members' completion tokens, ``masked_tokens`` those of masked members with a sequence.

    Raises:
        TypeError, ValueError, AttributeError: malformed rows.
    """
    failed = sum(int(a) for a in group.get("attempts") or ())
    masked = masked_tokens = 0
    for member in group.get("excluded") or ():
        failed += int(member.get("attempt") or 0)
        if member.get("outcome") == "masked":
            masked += 1
            masks = member.get("masks")
            masked_tokens += completion_tokens([masks] if masks is not None else None)
        else:
            failed += 1
    return {"completed": len(group.get("tokens") or ()), "masked": masked, "failed": failed,
            "tokens": completion_tokens(group.get("masks")), "masked_tokens": masked_tokens}


@dataclass(slots=True)
class LedgerEntry:
    """One journal entry (one row of the ``ledger`` table).

    Attributes:
        kind: one of :data:`ENTRY_KINDS`.
        env_id: the env it concerns (None: none, or a batch of several).
        ref: the group's cursor (``group``, ``stale``), the step (``served``), else None.
        completed, masked, failed: rollouts sampled, by outcome (``group``, ``env_drops``).
        sampled: completion tokens sampled (``group``: kept plus masked members'; ``env_drops``:
            every token of the dropped groups).
        masked_tokens: of ``sampled``, those of masked members (dropped at once).
        filtered: completion tokens of groups the env dropped (``env_drops``).
        stale: completion tokens of a group dropped as stale.
        served: completion tokens of a served batch.
        detail: small JSON: ``env_drops`` groups and tokens by reason; ``served`` group count.
        at: UNIX time of the entry.
        seq: position in the journal (assigned when appended; 0 before).
    """

    kind: str
    env_id: int | None = None
    ref: int | None = None
    completed: int = 0
    masked: int = 0
    failed: int = 0
    sampled: int = 0
    masked_tokens: int = 0
    filtered: int = 0
    stale: int = 0
    served: int = 0
    detail: dict[str, Any] | None = None
    at: float = field(default_factory=time.time)
    seq: int = 0

    def as_json(self) -> dict[str, Any]:
        """The entry as ``GET /ledger?entries=N`` shows it."""
        return asdict(self)


#: the columns of the journal, in table order (``detail`` is JSON)
_COLUMNS = tuple(f.name for f in fields(LedgerEntry))
_COUNTS = ("completed", "masked", "failed", "sampled", "masked_tokens", "filtered", "stale",
           "served")


def group_entry(group: Any, env_id: int | None, ref: int | None = None) -> LedgerEntry:
    """The journal entry of one accepted group (a :class:`~atroposlib.api.models.ScoredData`).

    Rollouts: each kept member is one completed rollout plus ``attempts[i]`` failed ones; each
    excluded member with attempt ``k`` is ``k`` failed rollouts plus its outcome (one masked or
    one more failed). Tokens: the kept members' completion tokens plus those of the masked
    members sent with their sequence (``masked_tokens``).
    """
    attempts = group.attempts or ()
    completed = len(group.tokens)
    masked = failed = masked_tokens = 0
    failed += sum(attempts)
    for member in group.excluded or ():
        failed += member.attempt
        if member.outcome == "masked":
            masked += 1
            masked_tokens += completion_tokens([member.masks] if member.masks is not None else None)
        else:
            failed += 1
    kept = completion_tokens(group.masks)
    return LedgerEntry("group", env_id, ref, completed=completed, masked=masked, failed=failed,
                       sampled=kept + masked_tokens, masked_tokens=masked_tokens)


def drops_entry(drops: Any, env_id: int | None) -> LedgerEntry:
    """The journal entry of an env's drop report (an :class:`~atroposlib.api.models.EnvDrops`)."""
    return LedgerEntry(
        "env_drops", env_id, completed=drops.completed, masked=drops.masked, failed=drops.failed,
        sampled=drops.tokens + drops.masked_tokens, masked_tokens=drops.masked_tokens,
        filtered=drops.tokens,
        detail={"groups": drops.groups, "groups_by_reason": dict(drops.groups_by_reason),
                "tokens_by_reason": dict(drops.tokens_by_reason)})


@dataclass
class LedgerTotals:
    """The sums of a journal's entries (every count is an int).

    Attributes:
        counts: the sum of each count column of :class:`LedgerEntry` over the journal.
        groups: entries by kind (``env_drops``: the groups it reported instead).
        filtered_by_reason: env-dropped groups' tokens by reason (``same_scores``, ...).
        filtered_groups_by_reason: env-dropped groups by reason.
    """

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTS, 0))
    groups: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENTRY_KINDS, 0))
    filtered_by_reason: dict[str, int] = field(default_factory=dict)
    filtered_groups_by_reason: dict[str, int] = field(default_factory=dict)

    def add(self, entry: LedgerEntry, sign: int = 1) -> None:
        """Add ``entry`` to the totals (``sign=-1`` takes it out again, to undo)."""
        for name in _COUNTS:
            self.counts[name] += sign * getattr(entry, name)
        detail = entry.detail or {}
        self.groups[entry.kind] += sign * (detail.get("groups", 0) if entry.kind == "env_drops" else 1)
        for target, key in ((self.filtered_by_reason, "tokens_by_reason"),
                            (self.filtered_groups_by_reason, "groups_by_reason")):
            for reason, n in (detail.get(key) or {}).items():
                target[reason] = target.get(reason, 0) + sign * int(n)
                if not target[reason]:
                    del target[reason]

    @property
    def empty(self) -> bool:
        """True when the journal holds nothing."""
        return not any(self.groups.values())


def ledger_view(totals: LedgerTotals, queued_tokens: int, buffered_tokens: int) -> dict[str, Any]:
    """The ledger as ``GET /ledger`` and ``GET /status?ledger=true`` answer it.

    Args:
        totals: the journal's totals.
        queued_tokens: completion tokens of the groups queued now.
        buffered_tokens: completion tokens of the partial groups buffered now.

    Returns:
        ``{"rollouts": {sampled, completed, masked, failed}, "tokens": {sampled, served,
        dropped_stale, dropped_filter, dropped_masked, queued}, "groups": {...},
        "dropped_filter_by_reason": {...}, "closes": bool}``; ``closes`` is False only when
        the journal and the queue disagree (a bug).
    """
    c = totals.counts
    rollouts = {"sampled": c["completed"] + c["masked"] + c["failed"], "completed": c["completed"],
                "masked": c["masked"], "failed": c["failed"]}
    tokens = {"sampled": c["sampled"], "served": c["served"], "dropped_stale": c["stale"],
              "dropped_filter": c["filtered"], "dropped_masked": c["masked_tokens"],
              "queued": queued_tokens + buffered_tokens}
    closes = tokens["sampled"] == sum(v for k, v in tokens.items() if k != "sampled")
    return {
        "rollouts": rollouts, "tokens": tokens,
        "groups": {"accepted": totals.groups["group"], "dropped_by_env": totals.groups["env_drops"],
                   "dropped_stale": totals.groups["stale"], "batches_served": totals.groups["served"]},
        "dropped_filter_by_reason": {
            reason: {"groups": totals.filtered_groups_by_reason.get(reason, 0), "tokens": n}
            for reason, n in sorted(totals.filtered_by_reason.items())},
        "closes": closes,
    }


class MemoryJournal:
    """The journal of a :class:`~atroposlib.api.store.MemoryStore`: totals plus the newest entries.

    Without ``--db`` nothing outlives the process, so the totals are the record; the newest
    :attr:`keep` entries are kept for ``GET /ledger?entries=N``. Writes made inside a store
    transaction are undone with it (``undo`` returns the transaction's undo list, or None).
    """

    def __init__(self, undo: Callable[[], list[Callable[[], None]] | None], keep: int = 10_000):
        self._undo = undo
        self._totals = LedgerTotals()
        self._entries: deque[LedgerEntry] = deque(maxlen=keep)
        self._next_seq = 1

    def append(self, entry: LedgerEntry) -> None:
        """Append one entry (assigns its ``seq``)."""
        entry.seq = self._next_seq
        self._next_seq += 1
        self._totals.add(entry)
        self._entries.append(entry)
        undo = self._undo()
        if undo is not None:
            def take_back(entry: LedgerEntry = entry) -> None:
                self._totals.add(entry, -1)
                with contextlib.suppress(ValueError):
                    self._entries.remove(entry)
                self._next_seq = min(self._next_seq, entry.seq)
            undo.append(take_back)

    def totals(self) -> LedgerTotals:
        """A copy of the totals."""
        t = self._totals
        return LedgerTotals(dict(t.counts), dict(t.groups), dict(t.filtered_by_reason),
                            dict(t.filtered_groups_by_reason))

    def entries(self, after: int = 0, limit: int = 100) -> list[LedgerEntry]:
        """Kept entries with ``seq > after``, oldest first, at most ``limit``."""
        return [e for e in self._entries if e.seq > after][:limit]

    def reset(self) -> None:
        """Forget everything (``/reset_data``)."""
        old = (self._totals, list(self._entries), self._next_seq)
        self._totals, self._next_seq = LedgerTotals(), 1
        self._entries.clear()
        undo = self._undo()
        if undo is not None:
            def restore() -> None:
                self._totals, self._next_seq = old[0], old[2]
                self._entries.clear()
                self._entries.extend(old[1])
            undo.append(restore)


#: The journal's table (created with the store's schema; rows are never updated).
LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, env_id INTEGER, ref INTEGER,
    completed INTEGER NOT NULL, masked INTEGER NOT NULL, failed INTEGER NOT NULL,
    sampled INTEGER NOT NULL, masked_tokens INTEGER NOT NULL, filtered INTEGER NOT NULL,
    stale INTEGER NOT NULL, served INTEGER NOT NULL, detail BLOB, at REAL NOT NULL);
"""


class SqliteJournal:
    """The journal of a :class:`~atroposlib.api.store.SqliteStore`: the ``ledger`` table.

    Appends run on the store's connection, inside its transactions (the caller's), so an entry
    commits with the queue change it records.
    """

    def __init__(self, db: sqlite3.Connection):
        self._db = db
        db.executescript(LEDGER_SCHEMA)

    def append(self, entry: LedgerEntry) -> None:
        """Append one entry (assigns its ``seq``)."""
        values = [getattr(entry, name) for name in _COLUMNS if name != "seq"]
        values[_COLUMNS.index("detail")] = (orjson.dumps(entry.detail)
                                             if entry.detail is not None else None)
        cur = self._db.execute(
            f"INSERT INTO ledger ({', '.join(n for n in _COLUMNS if n != 'seq')}) "
            f"VALUES ({', '.join('?' * (len(_COLUMNS) - 1))})", values)
        entry.seq = int(cur.lastrowid or 0)

    def totals(self) -> LedgerTotals:
        """Sum the journal (one pass over the table)."""
        totals = LedgerTotals()
        for entry in self._rows("SELECT * FROM ledger ORDER BY seq", ()):
            totals.add(entry)
        return totals

    def entries(self, after: int = 0, limit: int = 100) -> list[LedgerEntry]:
        """Entries with ``seq > after``, oldest first, at most ``limit``."""
        return list(self._rows("SELECT * FROM ledger WHERE seq > ? ORDER BY seq LIMIT ?",
                               (after, limit)))

    def _rows(self, sql: str, args: tuple) -> Iterable[LedgerEntry]:
        names = None
        cur = self._db.execute(sql.replace("*", ", ".join(_COLUMNS), 1), args)
        for row in cur:
            names = names or _COLUMNS
            values = dict(zip(names, row, strict=True))
            values["detail"] = orjson.loads(values["detail"]) if values["detail"] else None
            yield LedgerEntry(**values)

    def reset(self) -> None:
        """Forget everything (``/reset_data``)."""
        self._db.execute("DELETE FROM ledger")
