"""ApiState: the trajectory API's queue, env registry, partial-group buffers and step counter.

All methods are synchronous and never await, and the routes call them from ``async def``
handlers on the single event loop, so each request is applied atomically (as in Atropos 0.4).
Every mutation is one store transaction (see :mod:`atroposlib.api.store`), committed before the
handler answers.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from atroposlib.api.codec import encode_group, group_json, group_python
from atroposlib.api.errors import (
    IdempotencyKeyError,
    InvalidGroupError,
    PayloadTooLargeError,
    QueueFullError,
    StepConflictError,
    UnknownEnvError,
)
from atroposlib.api.models import PER_TOKEN_FIELDS, RegisterEnv, Registration, ScoredData
from atroposlib.api.packing import (
    allocation_needs,
    batch_size_problem,
    find_subset,
    pack_with_minimums,
    search_limit_note,
)
from atroposlib.api.settings import ApiSettings
from atroposlib.api.store import (
    GroupMeta,
    IdempotentReply,
    MemoryStore,
    PartialMeta,
    SqliteStore,
    open_store,
)

log = logging.getLogger("atroposlib.api")

#: ``env_weight`` never goes below this (as Atropos 0.4).
MIN_ENV_WEIGHT = 0.01
#: ``/latest_example`` before anything was queued (Atropos 0.4's placeholder, verbatim).
LATEST_PLACEHOLDER = orjson.dumps(
    {"tokens": [], "masks": [], "scores": [], "advantages": [], "ref_logprobs": [],
     "generation_params": [], "inference_logprobs": [], "messages": [], "images": []}
)
#: Fields with one entry per sequence: concatenated when partial groups are merged.
PER_SEQUENCE_FIELDS = ("tokens", "masks", "scores", *PER_TOKEN_FIELDS, "messages", "overrides",
                       "distill_token_ids", "distill_logprobs")
NOT_REGISTERED = {"status": "error", "message": "Trainer not registered. Call /register first.",
                  "batch": []}


@dataclass(slots=True)
class EnvRecord:
    """One registered environment (the Atropos 0.4 env record, plus a liveness timestamp).

    Attributes:
        registered_id: the env_id (index in the registry).
        desired_name: the name the env asked for.
        real_name: unique name ``<desired>_<k>`` (its W&B run name).
        max_context_len: the env's max token length.
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
    max_context_len: int
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


def _row_state(value: Any) -> str:
    if value is None:
        return "-"
    return "0" if len(value) == 0 else "n"


def _signature(group: ScoredData, target: int) -> str:
    """Return the key of partials that may merge: same target, optional fields and group fields."""
    parts = [target, [_row_state(getattr(group, f)) for f in PER_SEQUENCE_FIELDS],
             group.generation_params, group.group_overrides, group.images]
    return hashlib.sha1(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)).hexdigest()


def merge_partials(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate partial groups (same env and signature) into one group, in the given order.

    Args:
        parts: groups as plain dicts (14 keys); per-sequence fields are concatenated, group-level
            fields (generation_params, group_overrides, images, env_id) come from the first.

    Returns:
        The merged group dict.
    """
    merged = dict(parts[0])
    for name in PER_SEQUENCE_FIELDS:
        if merged[name] is None:
            continue
        merged[name] = [row for part in parts for row in (part[name] or [])]
    return merged


class ApiState:
    """The server's state; one instance per app (see :func:`atroposlib.api.factory.build_app`)."""

    def __init__(self, settings: ApiSettings | None = None, store: MemoryStore | SqliteStore | None = None):
        """Open the store named by ``settings.db`` (or use ``store``) and load what it holds."""
        self.settings = settings or ApiSettings()
        self.store = store or open_store(self.settings.db, self.settings.db_synchronous)
        self._load()

    # ------------------------------------------------------------------ loading / bookkeeping
    def _load(self) -> None:
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
                self._index_queued(g)
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
        last = meta.get("last_batch")
        #: (step, group ids in batch order) of the last served batch, while it can be served again
        self.last_batch: tuple[int, list[int]] | None = (
            (int(last["step"]), list(last["ids"])) if last else None)
        self.replies: OrderedDict[str, IdempotentReply] = OrderedDict(
            (r.key, r) for r in snap.replies)
        self.next_reply_seq = max((r.seq for r in snap.replies), default=0) + 1
        self.version = 0
        self._no_batch_key: tuple | None = None
        self._no_batch_reason = ""

    def _index_queued(self, g: GroupMeta) -> None:
        self.queue[g.id] = g
        self.queued_tokens += g.n_tokens
        self.queued_seqs_by_env[g.env_id] += g.n_seqs
        self.queued_size_counts[g.n_seqs] += 1

    def _unindex_queued(self, g: GroupMeta) -> None:
        del self.queue[g.id]
        self.queued_tokens -= g.n_tokens
        self.queued_seqs_by_env[g.env_id] -= g.n_seqs
        self.queued_size_counts[g.n_seqs] -= 1
        if not self.queued_size_counts[g.n_seqs]:
            del self.queued_size_counts[g.n_seqs]

    def close(self) -> None:
        """Close the store (flushes SQLite)."""
        self.store.close()

    @property
    def buffered_groups(self) -> int:
        """Partial groups waiting to be merged, over all envs."""
        return sum(len(v) for v in self.partials.values())

    def _env(self, env_id: int) -> EnvRecord:
        if 0 <= env_id < len(self.envs):
            return self.envs[env_id]
        known = f"0..{len(self.envs) - 1}" if self.envs else "none"
        raise UnknownEnvError(
            f"env_id {env_id} is not registered (registered ids: {known}). Call POST /register-env "
            "and use the env_id it returns; after /reset_data or a server restart without --db, "
            "envs must register again."
        )

    def _is_active(self, env: EnvRecord, now: float) -> bool:
        timeout = self.settings.env_heartbeat_timeout_s
        return env.connected and (not timeout or now - env.last_seen <= timeout)

    # ------------------------------------------------------------------ registration
    def register(self, reg: Registration) -> int:
        """``POST /register``: (re)configure the run; returns a fresh 128-bit uuid.

        A second registration updates the settings (batch size, step, ...) and keeps the queue
        and the envs (Atropos 0.4 silently ignored it).
        """
        again = self.registration is not None
        with self.store.transaction():
            self.store.set_meta("registration", reg.model_dump())
            self.store.set_meta("step", reg.starting_step)
            self.store.set_meta("last_batch", None)  # step numbering starts again
        self.registration = reg
        self.step = reg.starting_step
        self.last_batch = None
        self._changed()
        log.info(
            "trainer %s: batch_size=%d max_token_len=%d starting_step=%d num_steps=%d",
            "re-registered" if again else "registered", reg.batch_size, reg.max_token_len,
            reg.starting_step, reg.num_steps,
        )
        too_big = [g.id for g in self.queue.values() if g.n_seqs > reg.batch_size]
        if too_big:
            log.warning("%d queued groups are larger than batch_size=%d and can never be served",
                        len(too_big), reg.batch_size)
        return uuid.uuid4().int

    def register_env(self, req: RegisterEnv) -> dict[str, Any]:
        """``POST /register-env``: add an env once the trainer has polled ``/batch``."""
        if not self.started or self.registration is None:
            return {"status": "wait for trainer to start"}
        k = sum(1 for e in self.envs if e.desired_name == req.desired_name)
        env = EnvRecord(
            registered_id=len(self.envs), desired_name=req.desired_name,
            real_name=f"{req.desired_name}_{k}", max_context_len=req.max_token_length,
            weight=req.weight, group_size=req.group_size,
            min_batch_allocation=req.min_batch_allocation,
        )
        with self.store.transaction():
            self.store.put_env(env.registered_id, env.to_record())
        self.envs.append(env)
        self._changed()
        log.info("env registered: id=%d name=%s group_size=%d weight=%g min_batch_allocation=%s",
                 env.registered_id, env.real_name, env.group_size, env.weight,
                 env.min_batch_allocation)
        reg = self.registration
        problem = batch_size_problem(reg.batch_size, [e.group_size for e in self.envs])
        if problem is not None:
            log.warning("env %s registered, but %s", env.real_name, problem)
        return {
            "status": "success", "env_id": env.registered_id, "wandb_name": env.real_name,
            "checkpoint_dir": reg.checkpoint_dir, "starting_step": self.step,
            "checkpoint_interval": reg.save_checkpoint_interval, "num_steps": reg.num_steps,
        }

    def disconnect_env(self, env_id: int) -> dict[str, Any]:
        """``POST /disconnect-env``: the env stops counting for weights and minimums."""
        env = self._env(env_id)
        env.connected = False
        with self.store.transaction():
            self.store.put_env(env_id, env.to_record())
        self._changed()
        log.info("env disconnected: id=%d name=%s", env_id, env.real_name)
        return {"status": "success"}

    def reset(self) -> None:
        """``/reset_data``: forget everything (queue, buffers, envs, registration, latest, step).

        Cursors keep increasing, so ``/observe`` readers never see an id twice.
        """
        next_id = self.next_id
        with self.store.transaction():
            self.store.reset()
            self.store.set_meta("next_id", next_id)
        self._load()
        log.info("reset: queue, buffers, envs and registration cleared")

    def _changed(self) -> None:
        self.version += 1

    # ------------------------------------------------------------------ ingestion
    def _target_size(self, group: ScoredData) -> int | None:
        """Sequences a full group of this env has: group_overrides.group_size, else registered."""
        if group.env_id is None:
            return None
        override = (group.group_overrides or {}).get("group_size")
        if isinstance(override, int) and not isinstance(override, bool) and override > 0:
            return override
        return self.envs[group.env_id].group_size

    def _check(self, group: ScoredData) -> int | None:
        """Validate a group against the server state; return its target group size (or None)."""
        if group.env_id is not None:
            self._env(group.env_id)
        n = len(group.tokens)
        reg = self.registration
        if reg is not None and n > reg.batch_size:
            raise InvalidGroupError(
                f"group has {n} sequences but the trainer's batch_size is {reg.batch_size}: it "
                "could never be served; send groups of at most batch_size sequences"
            )
        target = self._target_size(group)
        if target is not None and reg is not None and target > reg.batch_size:
            raise InvalidGroupError(
                f"env {group.env_id}'s group_size {target} is larger than the trainer's batch_size "
                f"{reg.batch_size}: full groups could never be served; use a group_size (or "
                "group_overrides.group_size) of at most batch_size"
            )
        if target is not None and n > target:
            raise InvalidGroupError(
                f"group has {n} sequences but env {group.env_id} registered group_size={target}: "
                "send at most group_size sequences, or set group_overrides.group_size to the "
                "real size of this group"
            )
        return target

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
            InvalidGroupError: a group is larger than its env's group_size or the batch size.
            PayloadTooLargeError: the groups alone exceed ``max_queued_tokens``.
            QueueFullError: accepting them would pass the queue limits (nothing is queued).
        """
        targets = [self._check(g) for g in groups]
        sizes = [sum(len(r) for r in g.tokens) for g in groups]
        self._check_room(len(groups), sum(sizes))
        now = time.time()
        mono = time.monotonic()
        for g in groups:
            if g.env_id is not None:
                self.envs[g.env_id].last_seen = mono
        results = []
        try:
            with self.store.transaction():
                for group, target, n_tokens in zip(groups, targets, sizes, strict=True):
                    blob = encode_group(group)
                    if target is None or len(group.tokens) == target:
                        self._enqueue(group.env_id, len(group.tokens), n_tokens, now, blob,
                                      group.policy_version)
                        results.append({"status": "received"})
                    else:
                        results.append(self._buffer(group, target, n_tokens, now, blob))
                self.store.set_meta("next_id", self.next_id)
                self.store.set_meta("next_partial_id", self.next_partial_id)
                if remember is not None:
                    remember(results)
        except Exception:
            log.exception("storing scored data failed; reloading state from the store")
            self._load()
            raise
        self._changed()
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
        old = self.replies.get(key)
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
            self._remember(IdempotentReply(key, self.next_reply_seq, fingerprint, answer[0]))

        self.ingest(groups, remember)
        return answer[0], False

    def _remember(self, reply: IdempotentReply) -> None:
        """Store one answer and forget the oldest past ``--idempotency-keys`` (in a transaction)."""
        self.store.put_reply(reply)
        self.next_reply_seq += 1
        self.replies[reply.key] = reply
        forgotten = []
        while len(self.replies) > self.settings.idempotency_keys:
            forgotten.append(self.replies.popitem(last=False)[0])
        if forgotten:
            self.store.delete_replies(forgotten)

    def _check_room(self, n_groups: int, n_tokens: int) -> None:
        s = self.settings
        if n_tokens > s.max_queued_tokens:
            raise PayloadTooLargeError(
                f"these groups hold {n_tokens} tokens, more than the whole queue may hold "
                f"(--max-queued-tokens {s.max_queued_tokens}); send smaller groups or raise the limit"
            )
        groups_now = len(self.queue) + self.buffered_groups
        tokens_now = self.queued_tokens + self.buffered_tokens
        if groups_now + n_groups > s.max_queued_groups or tokens_now + n_tokens > s.max_queued_tokens:
            raise QueueFullError(
                f"queue full: {groups_now} groups / {tokens_now} tokens queued (limits "
                f"--max-queued-groups {s.max_queued_groups}, --max-queued-tokens "
                f"{s.max_queued_tokens}); the trainer is behind. Nothing was stored: retry after "
                f"{s.retry_after_s} s (BaseEnv and AtroposClient do), or raise the limits.",
                s.retry_after_s,
            )

    def _enqueue(self, env_id: int | None, n_seqs: int, n_tokens: int, now: float, blob: bytes,
                 policy_version: int | None = None) -> GroupMeta:
        g = GroupMeta(self.next_id, env_id, n_seqs, n_tokens, now, policy_version=policy_version)
        self.store.put_group(g, blob)
        self.next_id += 1
        self.groups[g.id] = g
        self._index_queued(g)
        self.latest_id = g.id
        return g

    def _buffer(self, group: ScoredData, target: int, n_tokens: int, now: float, blob: bytes) -> dict[str, Any]:
        env_id = key = group.env_id
        assert key is not None
        p = PartialMeta(self.next_partial_id, key, target, _signature(group, target),
                        len(group.tokens), n_tokens, now, group.policy_version)
        self.next_partial_id += 1
        self.store.put_partial(p, blob)
        buf = self.partials.setdefault(key, [])
        buf.append(p)
        self.buffered_tokens += n_tokens
        same = [q for q in buf if q.signature == p.signature]
        picked = find_subset([q.n_seqs for q in same], target)
        if picked:
            parts = [same[i] for i in picked]
            blobs = self.store.partial_blobs([q.id for q in parts])
            merged = merge_partials([group_python(blobs[q.id]) for q in parts])
            versions = [q.policy_version for q in parts if q.policy_version is not None]
            self._enqueue(env_id, target, sum(q.n_tokens for q in parts), now, encode_group(merged),
                          min(versions, default=None))  # the oldest weights that contributed
            self._drop_partials(key, parts)
        while len(buf) > self.settings.max_buffered_groups_per_env:
            oldest = buf[0]
            blob_old = self.store.partial_blobs([oldest.id])[oldest.id]
            self._enqueue(env_id, oldest.n_seqs, oldest.n_tokens, now, blob_old,
                          oldest.policy_version)
            self._drop_partials(key, [oldest])
            log.warning("env %s: partial-group buffer full (%d groups); queued a partial group of "
                        "%d/%d sequences unmerged", env_id, self.settings.max_buffered_groups_per_env,
                        oldest.n_seqs, oldest.target)
        if not buf:
            del self.partials[key]
        return {"status": "buffered", "buffer_size": sum(q.n_seqs for q in buf)}

    def _drop_partials(self, key: int, parts: list[PartialMeta]) -> None:
        ids = {q.id for q in parts}
        self.store.delete_partials(ids)
        buf = self.partials[key]
        buf[:] = [q for q in buf if q.id not in ids]
        self.buffered_tokens -= sum(q.n_tokens for q in parts)

    # ------------------------------------------------------------------ batches
    def _needs(self, batch_size: int, metas: list[GroupMeta]) -> dict[int, int]:
        now = time.monotonic()
        minimums = {e.registered_id: e.min_batch_allocation for e in self.envs
                    if e.min_batch_allocation is not None and self._is_active(e, now)}
        if not minimums:
            return {}
        smallest: dict[int, int] = {}
        for g in metas:
            if g.env_id in minimums:
                smallest[g.env_id] = min(smallest.get(g.env_id, g.n_seqs), g.n_seqs)
        return allocation_needs(batch_size, minimums, smallest)

    def next_batch(self) -> tuple[bytes | None, dict[str, Any]]:
        """``GET /batch``: form and serve ONE batch of exactly ``batch_size`` sequences.

        Returns:
            ``(body, info)``: body is the JSON response (``{"batch": [...]}``, or
            ``{"batch": null}`` when no subset of the queue fills a batch, or the "not
            registered" object); info has ``step``, ``groups``, ``sequences``, ``tokens``.
        """
        reg = self.registration
        if reg is None:
            return orjson.dumps(NOT_REGISTERED), {}
        if not self.started:
            self.started = True
            with self.store.transaction():
                self.store.set_meta("started", True)
            log.info("trainer polled /batch: envs may now register")
        self._drop_stale()
        metas = list(self.queue.values())
        needs = self._needs(reg.batch_size, metas)
        key = (self.version, reg.batch_size, tuple(sorted(needs.items())))
        if key == self._no_batch_key:
            return b'{"batch":null}', {"reason": self._no_batch_reason}
        sizes = [g.n_seqs for g in metas]
        if needs:
            picked = pack_with_minimums(sizes, [g.env_id for g in metas], reg.batch_size, needs)
        else:
            picked = find_subset(sizes, reg.batch_size)
        if picked is None:
            self._no_batch_key = key
            self._no_batch_reason = self._why_no_batch(reg.batch_size, metas, needs)
            return b'{"batch":null}', {"reason": self._no_batch_reason}
        chosen = [metas[i] for i in picked]
        body = self._batch_body([g.id for g in chosen])
        step = self.step + 1
        self.last_batch = (step, [g.id for g in chosen])
        for g in chosen:
            self._unindex_queued(g)
            g.served_step = step
            self.served.append(g)
            self.served_tokens += g.n_tokens
        pruned = self._prune_served()
        try:
            with self.store.transaction():
                self.store.mark_served([g.id for g in chosen], step)
                self.store.set_meta("step", step)
                self.store.set_meta("last_batch", {"step": step, "ids": [g.id for g in chosen]})
                self.store.delete_groups(g.id for g in pruned)
        except Exception:
            log.exception("recording a served batch failed; reloading state from the store")
            self._load()
            raise
        self.step = step
        self._changed()
        info = {"step": step, "groups": len(chosen), "sequences": reg.batch_size,
                "tokens": sum(g.n_tokens for g in chosen)}
        log.info("batch served: step=%d groups=%d sequences=%d tokens=%d queued_groups=%d",
                 step, info["groups"], reg.batch_size, info["tokens"], len(self.queue))
        return body, info

    @property
    def max_staleness(self) -> int | None:
        """Staleness limit in force: the trainer's registered ``max_staleness``, else the flag's."""
        reg = self.registration
        if reg is not None and reg.max_staleness is not None:
            return reg.max_staleness
        return self.settings.max_staleness

    def _drop_stale(self) -> None:
        """Forget queued groups more than ``max_staleness`` policy versions behind the step.

        A group is stale when ``step - policy_version > max_staleness``; groups without a
        policy_version are kept. Drops are counted per env and persisted with the store.
        """
        limit = self.max_staleness
        if limit is None:
            return
        stale = [g for g in self.queue.values()
                 if g.policy_version is not None and self.step - g.policy_version > limit]
        if not stale:
            return
        for g in stale:
            self._unindex_queued(g)
            del self.groups[g.id]
            self.stale_dropped[orjson.dumps(g.env_id).decode()] += 1
        try:
            with self.store.transaction():
                self.store.delete_groups(g.id for g in stale)
                self.store.set_meta("stale_dropped", dict(self.stale_dropped))
        except Exception:
            log.exception("dropping stale groups failed; reloading state from the store")
            self._load()
            raise
        self._changed()
        log.info("dropped %d stale groups (policy_version more than %d steps behind step %d): %s",
                 len(stale), limit, self.step, dict(Counter(g.env_id for g in stale)))

    def _batch_body(self, ids: list[int]) -> bytes:
        blobs = self.store.group_blobs(ids)
        return b'{"batch":[' + b",".join(group_json(blobs[i]) for i in ids) + b"]}"

    def batch_for_step(self, step: int) -> tuple[bytes | None, dict[str, Any]]:
        """``GET /batch?step=N``: the batch of step N, served once and then fetchable again.

        Steps count served batches: ``/register`` sets the step to its ``starting_step`` and
        each served batch is numbered one more than the step before it. So with N = the next
        step, a new batch is served exactly as by a plain ``GET /batch``; with N = the step of
        the last served batch, that same batch is answered again (same groups, same order)
        until the next batch is served. A trainer that lost a ``/batch`` reply (connection
        error, server crash) retries with the step it expected and gets its batch whether or
        not the server had served it. With ``--db`` this survives restarts.

        Args:
            step: the step the caller expects the batch to have.

        Returns:
            As :meth:`next_batch`; ``info["replayed"]`` is True for a batch answered again.

        Raises:
            StepConflictError: N is neither the next step nor the last served one (an older
                batch, or a step the server has not reached).
        """
        if self.registration is None:
            return orjson.dumps(NOT_REGISTERED), {}
        if step == self.step + 1:
            return self.next_batch()
        if self.last_batch is not None and step == self.step == self.last_batch[0]:
            ids = self.last_batch[1]
            log.warning("batch of step %d served again (the trainer lost the first reply)", step)
            return self._batch_body(ids), {
                "step": step, "groups": len(ids), "replayed": True,
                "sequences": sum(self.groups[i].n_seqs for i in ids),
                "tokens": sum(self.groups[i].n_tokens for i in ids)}
        if step > self.step:
            raise StepConflictError(
                f"step {step} is ahead of the server: it is at step {self.step}, so the next batch "
                f"is step {self.step + 1}. Did the trainer register with another starting_step, "
                "or was the API reset or restarted without --db?"
            )
        if self.last_batch is not None and self.last_batch[0] == self.step:
            why = (f"the server is at step {self.step} and only the last served batch (step "
                   f"{self.step}) can be fetched again")
        else:
            why = f"no batch was served as step {step} since the trainer registered"
        raise StepConflictError(
            f"the batch of step {step} cannot be served: {why}. GET /batch?step={self.step + 1} "
            "serves the next batch."
        )

    def _why_no_batch(self, batch_size: int, metas: list[GroupMeta], needs: dict[int, int]) -> str:
        """One line telling the trainer's operator why ``/batch`` answered null."""
        total = sum(g.n_seqs for g in metas)
        if total < batch_size:
            return (f"{total} sequences queued in {len(metas)} groups; batch_size is {batch_size}"
                    f" ({self.buffered_groups} partial groups buffered)")
        if needs and find_subset([g.n_seqs for g in metas], batch_size) is not None:
            short = [f"env {e} needs >= {n} sequences, has {self.queued_seqs_by_env.get(e, 0)}"
                     for e, n in needs.items()]
            return "min_batch_allocation not met: " + "; ".join(short)
        limit = search_limit_note([g.n_seqs for g in metas], batch_size)
        if limit:
            return limit
        sizes = sorted(Counter(g.n_seqs for g in metas).items())
        return (f"no combination of the queued group sizes {dict(sizes)} (size: count) sums to "
                f"batch_size {batch_size}")

    def _prune_served(self) -> list[GroupMeta]:
        """Drop the oldest served groups past the observe retention window.

        Never drops the latest example, nor the groups of the last batch (which
        ``GET /batch?step=N`` may serve again).
        """
        s = self.settings
        # keep /latest_example and a repeat of the last batch (GET /batch?step=N) answerable
        keep = {self.latest_id, *(self.last_batch[1] if self.last_batch else ())}
        pruned = []
        kept = []
        while self.served and (len(self.served) > s.observe_retention_groups
                               or self.served_tokens > s.observe_retention_tokens):
            g = self.served.popleft()
            self.served_tokens -= g.n_tokens
            if g.id in keep:
                kept.append(g)
                continue
            del self.groups[g.id]
            pruned.append(g)
        for g in reversed(kept):
            self.served.appendleft(g)
            self.served_tokens += g.n_tokens
        return pruned

    # ------------------------------------------------------------------ reads
    def status(self) -> dict[str, Any]:
        """``GET /status``: current step and number of queued groups.

        With a staleness limit set (or after any drop), also ``max_staleness`` and
        ``stale_groups_dropped`` (``{env_id: groups}``); otherwise the stock two keys.
        """
        out: dict[str, Any] = {"current_step": self.step, "queue_size": len(self.queue)}
        if self.max_staleness is not None or self.stale_dropped:
            out["max_staleness"] = self.max_staleness
            out["stale_groups_dropped"] = dict(self.stale_dropped)
        return out

    def status_env(self, env_id: int) -> dict[str, Any]:
        """``GET /status-env``: queue pressure seen by one env (without its 500s).

        Differences from Atropos 0.4: no permanent growth of the env's group_size; other envs'
        data counts even when every group has one sequence; no division by zero.

        Raises:
            UnknownEnvError: the env_id is not registered.
        """
        env = self._env(env_id)
        now = time.monotonic()
        env.last_seen = now
        active = [e for e in self.envs if self._is_active(e, now)]
        total = sum(e.max_context_len * max(0.0, e.weight) for e in active)
        if total > 0:
            env_weight = max(MIN_ENV_WEIGHT, env.max_context_len * env.weight / total)
        else:
            env_weight = 1.0 / max(1, len(active))
        minimum_sum = sum(e.min_batch_allocation for e in active if e.min_batch_allocation is not None)
        unallocated = 1.0 - min(minimum_sum, 1.0)
        max_group_size = max(self.queued_size_counts, default=1)
        own_sizes = [g.n_seqs for g in self.queue.values() if g.env_id == env_id] if (
            max_group_size > env.group_size) else []
        env_group_size = max([env.group_size, *own_sizes])
        self_seqs = self.queued_seqs_by_env.get(env_id, 0)
        batch_size = self.registration.batch_size if self.registration else 0
        min_seqs = {e.registered_id: int(batch_size * e.min_batch_allocation)
                    for e in active if e.min_batch_allocation is not None}
        available = sum(max(0, seqs - min_seqs.get(other, 0))
                        for other, seqs in self.queued_seqs_by_env.items() if other != env_id)
        return {
            "current_step": self.step,
            "queue_size": (self_seqs + available) // env_group_size,
            "unallocated_fraction": unallocated,
            "self_queue_size": self_seqs // env_group_size,
            "max_group_size": max(1, max_group_size),
            "env_weight": env_weight,
        } | ({"stale_groups_dropped": self.stale_dropped.get(str(env_id), 0)}
             if self.max_staleness is not None or self.stale_dropped else {})

    def info(self) -> dict[str, int]:
        """``GET /info``: ``batch_size`` and ``max_token_len``, -1 before registration."""
        reg = self.registration
        return {"batch_size": reg.batch_size if reg else -1,
                "max_token_len": reg.max_token_len if reg else -1}

    def wandb_info(self) -> dict[str, str | None]:
        """``GET /wandb_info``: W&B group and project, null before registration."""
        reg = self.registration
        return {"group": reg.wandb_group if reg else None,
                "project": reg.wandb_project if reg else None}

    def latest_example(self) -> bytes:
        """``GET /latest_example``: the last group that entered the queue, or the placeholder."""
        if self.latest_id is None or self.latest_id not in self.groups:
            return LATEST_PLACEHOLDER
        return group_json(self.store.group_blobs([self.latest_id])[self.latest_id])

    def observe(self, after: int, limit: int, env_id: int | None = None) -> bytes:
        """``GET /observe``: stored groups with cursor > ``after`` (queued or recently served).

        Args:
            after: the last cursor the reader has seen (0 to start from the oldest kept).
            limit: most groups to return.
            env_id: only this env's groups, when given.

        Returns:
            JSON ``{"groups": [{"cursor", "env_id", "received_at", "group"}], "next_cursor"}``;
            pass ``next_cursor`` as ``after`` next time.
        """
        picked: list[GroupMeta] = []
        for gid in reversed(self.groups):
            if gid <= after:
                break
            g = self.groups[gid]
            if env_id is None or g.env_id == env_id:
                picked.append(g)
        picked.reverse()
        if len(picked) > limit:
            picked = picked[:limit]
            next_cursor = picked[-1].id
        else:  # every cursor up to the newest ever assigned has been looked at
            next_cursor = max(after, self.next_id - 1)
        blobs = self.store.group_blobs(g.id for g in picked)
        items = [
            b'{"cursor":%d,"env_id":%s,"received_at":%s,"group":%s}' % (
                g.id, orjson.dumps(g.env_id), orjson.dumps(g.received_at), group_json(blobs[g.id]))
            for g in picked
        ]
        return b'{"groups":[' + b",".join(items) + b'],"next_cursor":%d}' % next_cursor
