"""Views: read-only answers about the state (status, status-env, info, latest example, observe)."""

from __future__ import annotations

import time
from typing import Any

import orjson

from atroposlib.api.codec import group_json
from atroposlib.api.core import StateCore
from atroposlib.api.store import GroupMeta

#: ``env_weight`` never goes below this (as Atropos 0.4).
MIN_ENV_WEIGHT = 0.01
#: ``/latest_example`` before anything was queued (Atropos 0.4's placeholder, verbatim).
LATEST_PLACEHOLDER = orjson.dumps(
    {"tokens": [], "masks": [], "scores": [], "advantages": [], "ref_logprobs": [],
     "generation_params": [], "inference_logprobs": [], "messages": [], "images": []}
)


class Views:
    """``/status``, ``/status-env``, ``/info``, ``/wandb_info``, ``/latest_example``, ``/observe``."""

    def __init__(self, core: StateCore):
        """Work on ``core`` (shared with the other parts of the state)."""
        self.core = core

    def status(self, ledger: bool = False) -> dict[str, Any]:
        """``GET /status``: current step and number of queued groups.

        With a staleness limit set (or after any drop), also ``max_staleness`` and
        ``stale_groups_dropped`` (``{env_id: groups}``); otherwise the stock two keys.
        ``ledger`` (``?ledger=true``) adds the run ledger under ``"ledger"`` (:meth:`ledger`).
        """
        out: dict[str, Any] = {"current_step": self.core.step, "queue_size": len(self.core.queue)}
        if self.core.max_staleness is not None or self.core.stale_dropped:
            out["max_staleness"] = self.core.max_staleness
            out["stale_groups_dropped"] = dict(self.core.stale_dropped)
        if ledger:
            out["ledger"] = self.core.ledger_view()
        return out

    def ledger(self, entries: int = 0, after: int = 0) -> dict[str, Any]:
        """``GET /ledger``: the run ledger (:func:`atroposlib.api.ledger.ledger_view`).

        Args:
            entries: also return up to this many journal entries with ``seq > after``
                (``"entries"``, oldest first; without ``--db`` only the newest 10,000 are kept).
            after: the last entry ``seq`` the reader has seen.
        """
        out = self.core.ledger_view()
        if entries:
            out["entries"] = [e.as_json() for e in self.core.store.journal.entries(after, entries)]
        return out

    def status_env(self, env_id: int) -> dict[str, Any]:
        """``GET /status-env``: queue pressure seen by one env (without its 500s).

        Differences from Atropos 0.4: no permanent growth of the env's group_size; other envs'
        data counts even when every group has one sequence; no division by zero. With a
        staleness limit in force it adds ``max_staleness`` (so the env can keep its groups
        within it), and with a limit or after any drop, ``stale_groups_dropped`` (this env's).

        Raises:
            UnknownEnvError: the env_id is not registered.
        """
        env = self.core.env(env_id)
        now = time.monotonic()
        env.last_seen = now
        active = [e for e in self.core.envs if self.core.is_active(e, now)]
        total = sum(e.max_seq_len * max(0.0, e.weight) for e in active)
        if total > 0:
            env_weight = max(MIN_ENV_WEIGHT, env.max_seq_len * env.weight / total)
        else:
            env_weight = 1.0 / max(1, len(active))
        minimum_sum = sum(e.min_batch_allocation for e in active if e.min_batch_allocation is not None)
        unallocated = 1.0 - min(minimum_sum, 1.0)
        max_group_size = max(self.core.queued_size_counts, default=1)
        own_sizes = [g.n_seqs for g in self.core.queue.values() if g.env_id == env_id] if (
            max_group_size > env.group_size) else []
        env_group_size = max([env.group_size, *own_sizes])
        self_seqs = self.core.queued_seqs_by_env.get(env_id, 0)
        batch_size = self.core.registration.batch_size if self.core.registration else 0
        min_seqs = {e.registered_id: int(batch_size * e.min_batch_allocation)
                    for e in active if e.min_batch_allocation is not None}
        available = sum(max(0, seqs - min_seqs.get(other, 0))
                        for other, seqs in self.core.queued_seqs_by_env.items() if other != env_id)
        return {
            "current_step": self.core.step,
            "queue_size": (self_seqs + available) // env_group_size,
            "unallocated_fraction": unallocated,
            "self_queue_size": self_seqs // env_group_size,
            "max_group_size": max(1, max_group_size),
            "env_weight": env_weight,
        } | ({"stale_groups_dropped": self.core.stale_dropped.get(str(env_id), 0)}
             if self.core.max_staleness is not None or self.core.stale_dropped else {}) | (
            {"max_staleness": self.core.max_staleness} if self.core.max_staleness is not None else {})

    def info(self) -> dict[str, int]:
        """``GET /info``: ``batch_size`` and ``max_token_len``, -1 before registration."""
        reg = self.core.registration
        return {"batch_size": reg.batch_size if reg else -1,
                "max_token_len": reg.max_token_len if reg else -1}

    def wandb_info(self) -> dict[str, str | None]:
        """``GET /wandb_info``: W&B group and project, null before registration."""
        reg = self.core.registration
        return {"group": reg.wandb_group if reg else None,
                "project": reg.wandb_project if reg else None}

    def latest_example(self) -> bytes:
        """``GET /latest_example``: the last group that entered the queue, or the placeholder."""
        if self.core.latest_id is None or self.core.latest_id not in self.core.groups:
            return LATEST_PLACEHOLDER
        return group_json(self.core.store.group_blobs([self.core.latest_id])[self.core.latest_id])

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
        for gid in reversed(self.core.groups):
            if gid <= after:
                break
            g = self.core.groups[gid]
            if env_id is None or g.env_id == env_id:
                picked.append(g)
        picked.reverse()
        if len(picked) > limit:
            picked = picked[:limit]
            next_cursor = picked[-1].id
        else:  # every cursor up to the newest ever assigned has been looked at
            next_cursor = max(after, self.core.next_id - 1)
        blobs = self.core.store.group_blobs(g.id for g in picked)
        items = [
            b'{"cursor":%d,"env_id":%s,"received_at":%s,"group":%s}' % (
                g.id, orjson.dumps(g.env_id), orjson.dumps(g.received_at), group_json(blobs[g.id]))
            for g in picked
        ]
        return b'{"groups":[' + b",".join(items) + b'],"next_cursor":%d}' % next_cursor
