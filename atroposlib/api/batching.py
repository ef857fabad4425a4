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
from atroposlib.api.packing import (
    allocation_needs,
    find_subset,
    pack_with_minimums,
    search_limit_note,
)
from atroposlib.api.store import GroupMeta

log = logging.getLogger("atroposlib.api")

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
            with self.core.store.transaction():
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
        self.core.last_batch = (step, [g.id for g in chosen])
        for g in chosen:
            self.core.unindex_queued(g)
            g.served_step = step
            self.core.served.append(g)
            self.core.served_tokens += g.n_tokens
        pruned = self._prune_served()
        try:
            with self.core.store.transaction():
                self.core.store.mark_served([g.id for g in chosen], step)
                self.core.store.set_meta("step", step)
                self.core.store.set_meta("last_batch", {"step": step, "ids": [g.id for g in chosen]})
                self.core.store.delete_groups(g.id for g in pruned)
        except Exception:
            log.exception("recording a served batch failed; reloading state from the store")
            self.core.load()
            raise
        self.core.step = step
        self.core.changed()
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
        try:
            with self.core.store.transaction():
                self.core.store.delete_groups(g.id for g in stale)
                self.core.store.set_meta("stale_dropped", dict(self.core.stale_dropped))
        except Exception:
            log.exception("dropping stale groups failed; reloading state from the store")
            self.core.load()
            raise
        self.core.changed()
        log.info("dropped %d stale groups (policy_version more than %d steps behind step %d): %s",
                 len(stale), limit, self.core.step, dict(Counter(g.env_id for g in stale)))

    def _batch_body(self, ids: list[int]) -> bytes:
        blobs = self.core.store.group_blobs(ids)
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
        if self.core.registration is None:
            return orjson.dumps(NOT_REGISTERED), {}
        if step == self.core.step + 1:
            return self.next_batch()
        if self.core.last_batch is not None and step == self.core.step == self.core.last_batch[0]:
            ids = self.core.last_batch[1]
            log.warning("batch of step %d served again (the trainer lost the first reply)", step)
            return self._batch_body(ids), {
                "step": step, "groups": len(ids), "replayed": True,
                "sequences": sum(self.core.groups[i].n_seqs for i in ids),
                "tokens": sum(self.core.groups[i].n_tokens for i in ids)}
        if step > self.core.step:
            raise StepConflictError(
                f"step {step} is ahead of the server: it is at step {self.core.step}, so the next batch "
                f"is step {self.core.step + 1}. Did the trainer register with another starting_step, "
                "or was the API reset or restarted without --db?"
            )
        if self.core.last_batch is not None and self.core.last_batch[0] == self.core.step:
            why = (f"the server is at step {self.core.step} and only the last served batch (step "
                   f"{self.core.step}) can be fetched again")
        else:
            why = f"no batch was served as step {step} since the trainer registered"
        raise StepConflictError(
            f"the batch of step {step} cannot be served: {why}. GET /batch?step={self.core.step + 1} "
            "serves the next batch."
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

        Never drops the latest example, nor the groups of the last batch (which
        ``GET /batch?step=N`` may serve again).
        """
        s = self.core.settings
        # keep /latest_example and a repeat of the last batch (GET /batch?step=N) answerable
        keep = {self.core.latest_id, *(self.core.last_batch[1] if self.core.last_batch else ())}
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

