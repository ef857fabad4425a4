"""Ingestion: accepting scored groups (checks, queue limits, idempotent POSTs, partial-group buffers)."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from atroposlib.api.checks import group_problem
from atroposlib.api.codec import encode_group, group_python
from atroposlib.api.core import StateCore
from atroposlib.api.errors import (
    IdempotencyKeyError,
    InvalidGroupError,
    PayloadTooLargeError,
    QueueFullError,
)
from atroposlib.api.ledger import drops_entry, group_entry
from atroposlib.api.models import ScoredData
from atroposlib.api.packing import find_subset
from atroposlib.api.shapes import PER_TOKEN_FIELDS
from atroposlib.api.store import GroupMeta, IdempotentReply, PartialMeta

log = logging.getLogger("atroposlib.api")

#: Fields with one entry per sequence: concatenated when partial groups are merged.
PER_SEQUENCE_FIELDS = ("tokens", "masks", "scores", *PER_TOKEN_FIELDS, "messages", "overrides",
                       "distill_token_ids", "distill_logprobs", "rollout_ids", "attempts")


def _row_state(value: Any) -> str:
    if value is None:
        return "-"
    return "0" if len(value) == 0 else "n"


def _signature(group: ScoredData, target: int) -> str:
    """Return the key of partials that may merge: same target, optional fields and group fields."""
    parts = [target, [_row_state(getattr(group, f)) for f in PER_SEQUENCE_FIELDS],
             group.generation_params, group.group_overrides, group.images]
    if group.item is not None:  # parts of one group share its item (absent: the old key)
        parts.append(group.item)
    return hashlib.sha1(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)).hexdigest()


def merge_partials(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate partial groups (same env and signature) into one group, in the given order.

    Args:
        parts: groups as plain dicts (14 keys); per-sequence fields are concatenated, group-level
            fields (generation_params, group_overrides, images, env_id, item) come from the first.

    Returns:
        The merged group dict.
    """
    merged = dict(parts[0])
    for name in PER_SEQUENCE_FIELDS:
        if merged.get(name) is None:
            continue
        merged[name] = [row for part in parts for row in (part.get(name) or [])]
    return merged



class Ingestion:
    """``POST /scored_data`` and ``/scored_data_list`` on a :class:`StateCore`."""

    def __init__(self, core: StateCore):
        """Work on ``core`` (shared with the other parts of the state)."""
        self.core = core

    def _target_size(self, group: ScoredData) -> int | None:
        """Sequences a full group of this env has: group_overrides.group_size, else registered."""
        if group.env_id is None:
            return None
        override = (group.group_overrides or {}).get("group_size")
        if isinstance(override, int) and not isinstance(override, bool) and override > 0:
            return override
        return self.core.envs[group.env_id].group_size

    def _check(self, group: ScoredData) -> int | None:
        """Validate a group against the server state; return its target group size (or None)."""
        if group.env_id is not None:
            self.core.env(group.env_id)
        n = len(group.tokens)
        reg = self.core.registration
        if reg is not None and n > reg.batch_size:
            raise InvalidGroupError(
                f"group has {n} sequences but the trainer's batch_size is {reg.batch_size}: it "
                "could never be served; send groups of at most batch_size sequences",
                reason="group_size")
        target = self._target_size(group)
        if target is not None and reg is not None and target > reg.batch_size:
            raise InvalidGroupError(
                f"env {group.env_id}'s group_size {target} is larger than the trainer's batch_size "
                f"{reg.batch_size}: full groups could never be served; use a group_size (or "
                "group_overrides.group_size) of at most batch_size", reason="group_size")
        if target is not None and n > target:
            raise InvalidGroupError(
                f"group has {n} sequences but env {group.env_id} registered group_size={target}: "
                "send at most group_size sequences, or set group_overrides.group_size to the "
                "real size of this group", reason="group_size")
        if target is not None and group.excluded is not None and n + len(group.excluded) > target:
            raise InvalidGroupError(
                f"group has {n} kept and {len(group.excluded)} excluded members but env "
                f"{group.env_id} registered group_size={target}: kept plus excluded members are "
                "the group's rollouts, at most group_size of them", reason="group_size")
        problem = group_problem(
            group.tokens, group.masks, group.scores,
            vocab_size=reg.vocab_size if reg is not None else None,
            max_token_len=reg.max_token_len if reg is not None else None,
            check_labels=reg is None or reg.vocab_size is not None)
        if problem is not None:
            raise InvalidGroupError(problem.message, reason=problem.reason)
        return target

    def _who(self, group: ScoredData, index: int, count: int) -> str:
        """Name a group of a request and its env, for refusals: ``group 2 of 3 (env 0 'gsm8k_0')``."""
        where = f"group {index} of {count} in this request" if count > 1 else "the group"
        if group.env_id is None:
            return f"{where} (no env_id)"
        env = self.core.envs[group.env_id]
        return f"{where} (env {group.env_id} {env.real_name!r})"

    def check_all(self, groups: list[ScoredData]) -> list[int | None]:
        """Validate every group of a request; return their target group sizes.

        Raises:
            UnknownEnvError, InvalidGroupError: as :meth:`ingest`; an invalid group's message
                starts with the group and its env (``group 2 of 3 (env 0 'gsm8k_0'): ...``).
        """
        targets = []
        for i, group in enumerate(groups):
            try:
                targets.append(self._check(group))
            except InvalidGroupError as exc:
                raise InvalidGroupError(f"{self._who(group, i, len(groups))}: {exc.detail}",
                                        reason=exc.reason) from None
        return targets

    def ingest(
        self,
        groups: list[ScoredData],
        remember: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Queue (or buffer) scored groups, all or nothing.

        Args:
            groups: validated groups, in arrival order.
            remember: called with the results inside the transaction that stores the groups
                (see :meth:`ingest_once`).

        Returns:
            One response dict per group: ``{"status": "received"}`` or
            ``{"status": "buffered", "buffer_size": n}``.

        Raises:
            UnknownEnvError: a group names an unregistered env_id (nothing is queued).
            InvalidGroupError: a group is larger than its env's group_size or the batch size, or
                fails a poison check (see :mod:`atroposlib.api.checks`).
            PayloadTooLargeError: the groups alone exceed ``max_queued_tokens``.
            QueueFullError: accepting them would pass the queue limits (nothing is queued).
            InsufficientStorageError: the ``--db`` disk is full (nothing is queued).
        """
        targets = self.check_all(groups)
        sizes = [sum(len(r) for r in g.tokens) for g in groups]
        self._check_room(len(groups), sum(sizes))
        now = time.time()
        mono = time.monotonic()
        for g in groups:
            if g.env_id is not None:
                self.core.envs[g.env_id].last_seen = mono
        results = []
        with self.core.transaction("storing scored data"):
            for group, target, n_tokens in zip(groups, targets, sizes, strict=True):
                blob = encode_group(group)
                entry = group_entry(group, group.env_id)  # the run ledger's record of it
                kept = entry.sampled - entry.masked_tokens
                # a group with an excluded list accounts for all its members: complete as sent
                if target is None or len(group.tokens) == target or group.excluded is not None:
                    entry.ref = self._enqueue(group.env_id, len(group.tokens), n_tokens, now, blob,
                                              group.policy_version, kept).id
                    results.append({"status": "received"})
                else:
                    results.append(self._buffer(group, target, n_tokens, now, blob, kept))
                self.core.record(entry)
                if group.env_drops is not None:
                    self.core.record(drops_entry(group.env_drops, group.env_id))
            self.core.store.set_meta("next_id", self.core.next_id)
            self.core.store.set_meta("next_partial_id", self.core.next_partial_id)
            if remember is not None:
                remember(results)
        self.core.changed()
        return results

    def ingest_once(
        self,
        key: str,
        fingerprint: str,
        groups: list[ScoredData],
        render: Callable[[list[dict[str, Any]]], bytes],
    ) -> tuple[bytes, bool]:
        """Queue groups sent with an ``Idempotency-Key``, or answer a repeat as the first time.

        The answer is stored with the groups in one transaction, so a client that lost the reply
        and sends the same request again gets the same answer and nothing is stored twice, even
        across a server crash with ``--db``. The newest ``--idempotency-keys`` answers are kept.
        Refused requests (4xx, 429) are not remembered: they stored nothing, and a retry is
        judged afresh.

        Args:
            key: the route path and the client's key (keys of different routes never match).
            fingerprint: hash of the request body.
            groups: the validated groups.
            render: turns :meth:`ingest`'s results into the JSON answer.

        Returns:
            ``(answer, replayed)``: replayed is True when the key was seen before.

        Raises:
            IdempotencyKeyError: the key was used before for a different body.
            ApiRequestError: as :meth:`ingest`.
        """
        old = self.core.replies.get(key)
        if old is not None:
            if old.fingerprint != fingerprint:
                raise IdempotencyKeyError(
                    f"Idempotency-Key {key.split(' ', 1)[1]!r} was already used for a different "
                    "request body; send a new key with each new request, and the same key only "
                    "when repeating the same request"
                )
            return old.reply, True
        answer: list[bytes] = []

        def remember(results: list[dict[str, Any]]) -> None:
            answer.append(render(results))
            self._remember(IdempotentReply(key, self.core.next_reply_seq, fingerprint, answer[0]))

        self.ingest(groups, remember)
        return answer[0], False

    def _remember(self, reply: IdempotentReply) -> None:
        """Store one answer and forget the oldest past ``--idempotency-keys`` (in a transaction)."""
        self.core.store.put_reply(reply)
        self.core.next_reply_seq += 1
        self.core.replies[reply.key] = reply
        forgotten = []
        while len(self.core.replies) > self.core.settings.idempotency_keys:
            forgotten.append(self.core.replies.popitem(last=False)[0])
        if forgotten:
            self.core.store.delete_replies(forgotten)

    def _check_room(self, n_groups: int, n_tokens: int) -> None:
        s = self.core.settings
        if n_tokens > s.max_queued_tokens:
            raise PayloadTooLargeError(
                f"these groups hold {n_tokens} tokens, more than the whole queue may hold "
                f"(--max-queued-tokens {s.max_queued_tokens}); send smaller groups or raise the limit"
            )
        groups_now = len(self.core.queue) + self.core.buffered_groups
        tokens_now = self.core.queued_tokens + self.core.buffered_tokens
        if groups_now + n_groups > s.max_queued_groups or tokens_now + n_tokens > s.max_queued_tokens:
            raise QueueFullError(
                f"queue full: {groups_now} groups / {tokens_now} tokens queued (limits "
                f"--max-queued-groups {s.max_queued_groups}, --max-queued-tokens "
                f"{s.max_queued_tokens}); the trainer is behind. Nothing was stored: retry after "
                f"{s.retry_after_s} s (BaseEnv and AtroposClient do), or raise the limits.",
                s.retry_after_s,
            )

    def _enqueue(self, env_id: int | None, n_seqs: int, n_tokens: int, now: float, blob: bytes,
                 policy_version: int | None = None, ledger_tokens: int = 0) -> GroupMeta:
        g = GroupMeta(self.core.next_id, env_id, n_seqs, n_tokens, now, policy_version=policy_version,
                      ledger_tokens=ledger_tokens)
        self.core.store.put_group(g, blob)
        self.core.next_id += 1
        self.core.groups[g.id] = g
        self.core.index_queued(g)
        self.core.latest_id = g.id
        return g

    def _buffer(self, group: ScoredData, target: int, n_tokens: int, now: float, blob: bytes,
                ledger_tokens: int = 0) -> dict[str, Any]:
        env_id = key = group.env_id
        assert key is not None
        p = PartialMeta(self.core.next_partial_id, key, target, _signature(group, target),
                        len(group.tokens), n_tokens, now, group.policy_version, ledger_tokens)
        self.core.next_partial_id += 1
        self.core.store.put_partial(p, blob)
        buf = self.core.partials.setdefault(key, [])
        buf.append(p)
        self.core.buffered_tokens += n_tokens
        same = [q for q in buf if q.signature == p.signature]
        picked = find_subset([q.n_seqs for q in same], target)
        if picked:
            parts = [same[i] for i in picked]
            blobs = self.core.store.partial_blobs([q.id for q in parts])
            merged = merge_partials([group_python(blobs[q.id]) for q in parts])
            versions = [q.policy_version for q in parts if q.policy_version is not None]
            self._enqueue(env_id, target, sum(q.n_tokens for q in parts), now, encode_group(merged),
                          min(versions, default=None),  # the oldest weights that contributed
                          sum(q.ledger_tokens for q in parts))
            self._drop_partials(key, parts)
        while len(buf) > self.core.settings.max_buffered_groups_per_env:
            oldest = buf[0]
            blob_old = self.core.store.partial_blobs([oldest.id])[oldest.id]
            self._enqueue(env_id, oldest.n_seqs, oldest.n_tokens, now, blob_old,
                          oldest.policy_version, oldest.ledger_tokens)
            self._drop_partials(key, [oldest])
            log.warning("env %s: partial-group buffer full (%d groups); queued a partial group of "
                        "%d/%d sequences unmerged", env_id, self.core.settings.max_buffered_groups_per_env,
                        oldest.n_seqs, oldest.target)
        if not buf:
            del self.core.partials[key]
        return {"status": "buffered", "buffer_size": sum(q.n_seqs for q in buf)}

    def _drop_partials(self, key: int, parts: list[PartialMeta]) -> None:
        ids = {q.id for q in parts}
        self.core.store.delete_partials(ids)
        buf = self.core.partials[key]
        buf[:] = [q for q in buf if q.id not in ids]
        self.core.buffered_tokens -= sum(q.n_tokens for q in parts)

