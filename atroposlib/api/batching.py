"""Batching: choosing and serving batches of exactly ``batch_size`` sequences, and the step counter."""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import orjson

from atroposlib.api.codec import group_json
from atroposlib.api.core import StateCore
from atroposlib.api.errors import StepConflictError
from atroposlib.api.ledger import LedgerEntry
from atroposlib.api.packing import (
    allocation_needs,
    find_subset,
    pack_with_minimums,
    search_limit_note,
)
from atroposlib.api.store import GroupMeta

log = logging.getLogger("atroposlib.api")

#: Header of a 409 answer to ``GET /batch?step=N``: the oldest step that can be answered again.
OLDEST_STEP_HEADER = "X-Atropos-Oldest-Step"
NOT_REGISTERED = {"status": "error", "message": "Trainer not registered. Call /register first.",
                  "batch": []}


class Batching:
    """``GET /batch`` (and ``?step=N``), staleness drops and the served-group window on a :class:`StateCore`."""

    def __init__(self, core: StateCore):
        """Work on ``core`` (shared with the other parts of the state)."""
        self.core = core

    def _needs(self, batch_size: int, metas: list[GroupMeta]) -> dict[int, int]:
        now = time.monotonic()
        minimums = {e.registered_id: e.min_batch_allocation for e in self.core.envs
                    if e.min_batch_allocation is not None and self.core.is_active(e, now)}
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
        reg = self.core.registration
        if reg is None:
            return orjson.dumps(NOT_REGISTERED), {}
        if not self.core.started:
            self.core.started = True
            with self.core.transaction("recording the trainer's first poll"):
                self.core.store.set_meta("started", True)
            log.info("trainer polled /batch: envs may now register")
        self._drop_stale()
        metas = list(self.core.queue.values())
        needs = self._needs(reg.batch_size, metas)
        key = (self.core.version, reg.batch_size, tuple(sorted(needs.items())))
        if key == self.core.no_batch_key:
            return b'{"batch":null}', {"reason": self.core.no_batch_reason}
        sizes = [g.n_seqs for g in metas]
        if needs:
            picked = pack_with_minimums(sizes, [g.env_id for g in metas], reg.batch_size, needs)
        else:
            picked = find_subset(sizes, reg.batch_size)
        if picked is None:
            self.core.no_batch_key = key
            self.core.no_batch_reason = self._why_no_batch(reg.batch_size, metas, needs)
            return b'{"batch":null}', {"reason": self.core.no_batch_reason}
        chosen = [metas[i] for i in picked]
        body = self._batch_body([g.id for g in chosen])
        step = self.core.step + 1
        ids = [g.id for g in chosen]
        self.core.batches[step] = ids
        forgotten = list(self.core.batches)[:-self.core.replay_batches]
        for old in forgotten:
            del self.core.batches[old]
        for g in chosen:
            self.core.unindex_queued(g)
            g.served_step = step
            self.core.served.append(g)
            self.core.served_tokens += g.n_tokens
        pruned = self._prune_served()
        with self.core.transaction("recording a served batch"):
            self.core.record(LedgerEntry("served", ref=step, detail={"groups": len(chosen)},
                                         served=sum(g.ledger_tokens for g in chosen)))
            self.core.store.mark_served(ids, step)
            self.core.store.set_meta("step", step)
            self.core.store.put_batch(step, ids)
            self.core.store.delete_batches(forgotten)
            self.core.store.delete_groups(g.id for g in pruned)
        self.core.step = step
        self.core.changed()
        self.core.metrics.served(step, chosen)
        info = {"step": step, "groups": len(chosen), "sequences": reg.batch_size,
                "tokens": sum(g.n_tokens for g in chosen)}
        log.info("batch served: step=%d groups=%d sequences=%d tokens=%d queued_groups=%d",
                 step, info["groups"], reg.batch_size, info["tokens"], len(self.core.queue))
        return body, info

    def _drop_stale(self) -> None:
        """Forget queued groups more than ``max_staleness`` policy versions behind the step.

        A group is stale when ``step - policy_version > max_staleness``; groups without a
        policy_version are kept. Drops are counted per env and persisted with the store.
        """
        limit = self.core.max_staleness
        if limit is None:
            return
        stale = [g for g in self.core.queue.values()
                 if g.policy_version is not None and self.core.step - g.policy_version > limit]
        if not stale:
            return
        for g in stale:
            self.core.unindex_queued(g)
            del self.core.groups[g.id]
            self.core.stale_dropped[orjson.dumps(g.env_id).decode()] += 1
        with self.core.transaction("dropping stale groups"):
            for g in stale:
                self.core.record(LedgerEntry("stale", g.env_id, g.id, stale=g.ledger_tokens))
            self.core.store.delete_groups(g.id for g in stale)
            self.core.store.set_meta("stale_dropped", dict(self.core.stale_dropped))
        self.core.changed()
        self.core.metrics.dropped_stale.inc(len(stale))
        log.info("dropped %d stale groups (policy_version more than %d steps behind step %d): %s",
                 len(stale), limit, self.core.step, dict(Counter(g.env_id for g in stale)))

    def _batch_body(self, ids: list[int]) -> bytes:
        blobs = self.core.store.group_blobs(ids)
        return b'{"batch":[' + b",".join(group_json(blobs[i]) for i in ids) + b"]}"

    def batch_for_step(self, step: int) -> tuple[bytes | None, dict[str, Any]]:
        """``GET /batch?step=N``: the batch of step N, served once and then fetchable again.

        Steps count served batches: the first ``/register`` sets the step to its
        ``starting_step`` and each served batch is numbered one more than the step before it.
        With N = the next step, a new batch is served exactly as by a plain ``GET /batch``; with
        N = the step of one of the last :attr:`StateCore.replay_batches` served batches, that
        same batch is answered again (same groups, same order). A trainer that lost a
        ``/batch`` reply (connection error, server crash) retries with the step it expected and
        gets its batch whether or not the server had served it; a trainer that restarted from
        the checkpoint of step C fetches steps C+1, C+2, ... and gets the batches it had not
        trained on before new ones. With ``--db`` this survives restarts.

        Args:
            step: the step the caller expects the batch to have.

        Returns:
            As :meth:`next_batch`; ``info["replayed"]`` is True for a batch answered again.

        Raises:
            StepConflictError: N is ahead of the next step, or an older step whose batch is no
                longer kept (the message and the ``X-Atropos-Oldest-Step`` header name the
                oldest step that is).
        """
        core = self.core
        if core.registration is None:
            return orjson.dumps(NOT_REGISTERED), {}
        if step == core.step + 1:
            return self.next_batch()
        ids = core.batches.get(step)
        if ids is not None:
            log.info("batch of step %d served again (a lost reply, or a trainer that restarted "
                     "from a checkpoint)", step)
            core.metrics.batches.labels("true").inc()
            return self._batch_body(ids), {
                "step": step, "groups": len(ids), "replayed": True,
                "sequences": sum(core.groups[i].n_seqs for i in ids),
                "tokens": sum(core.groups[i].n_tokens for i in ids)}
        if step > core.step:
            raise StepConflictError(
                f"step {step} is ahead of the server: it is at step {core.step}, so the next batch "
                f"is step {core.step + 1}. Did the trainer register with another starting_step, "
                "or was the API reset or restarted without --db?"
            )
        oldest = core.oldest_replayable_step
        if oldest is not None:
            raise StepConflictError(
                f"the batch of step {step} is no longer kept: run-api keeps the last "
                f"{core.replay_batches} served batches (--replay-batches), steps {oldest}.."
                f"{core.step}; the oldest step it can answer again is {oldest}. "
                f"GET /batch?step={core.step + 1} serves the next batch.",
                headers={OLDEST_STEP_HEADER: str(oldest)})
        raise StepConflictError(
            f"the batch of step {step} cannot be served: no batch served since the trainer "
            f"registered is kept. GET /batch?step={core.step + 1} serves the next batch."
        )

    def _why_no_batch(self, batch_size: int, metas: list[GroupMeta], needs: dict[int, int]) -> str:
        """One line telling the trainer's operator why ``/batch`` answered null."""
        total = sum(g.n_seqs for g in metas)
        if total < batch_size:
            return (f"{total} sequences queued in {len(metas)} groups; batch_size is {batch_size}"
                    f" ({self.core.buffered_groups} partial groups buffered)")
        if needs and find_subset([g.n_seqs for g in metas], batch_size) is not None:
            short = [f"env {e} needs >= {n} sequences, has {self.core.queued_seqs_by_env.get(e, 0)}"
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

        Never drops the latest example, nor the groups of the kept batches (which
        ``GET /batch?step=N`` may serve again).
        """
        s = self.core.settings
        # keep /latest_example and the kept batches (GET /batch?step=N) answerable
        keep = {self.core.latest_id, *(i for ids in self.core.batches.values() for i in ids)}
        pruned = []
        kept = []
        while self.core.served and (len(self.core.served) > s.observe_retention_groups
                               or self.core.served_tokens > s.observe_retention_tokens):
            g = self.core.served.popleft()
            self.core.served_tokens -= g.n_tokens
            if g.id in keep:
                kept.append(g)
                continue
            del self.core.groups[g.id]
            pruned.append(g)
        for g in reversed(kept):
            self.core.served.appendleft(g)
            self.core.served_tokens += g.n_tokens
        return pruned

