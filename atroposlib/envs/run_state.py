"""The run state: what a runner knows about the run, and the env may read but not write.

A runner (serve loop, process or evaluate runner in :mod:`atroposlib.env_runtime`) creates one
``RunState``, binds it to the env with ``env.bind_run_state(state)`` and is the only writer of
its fields afterwards: the env's id at the API, the trainer step, the last ``/status-env`` answer,
the trainer's limits (``batch_size``, ``max_seq_len``, ``total_steps``) and the counters. The
env reads it through ``env.run_state`` (a read-only view) or through its Atropos-compatible
read-only attributes (``env.curr_step``, ``env.max_token_len`` = ``max_seq_len``, ``env.env_id``
...).

``stats``, ``completion_lengths`` and ``task_durations`` are containers: the env's own
bookkeeping (counting dropped groups, recording lengths) updates their contents.
"""

from __future__ import annotations

import contextvars
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from atroposlib.envs.drops import DropTally
from atroposlib.envs.groups import completion_lengths, normalise_group

#: Trainer step when the current rollout started; set per rollout task by the serve loop. The
#: fallback policy version of a group whose inference server reports none.
ROLLOUT_POLICY_VERSION: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "rollout_policy_version", default=None)


@dataclass
class RunState:
    """Runner-owned facts about one run (see the module docstring).

    Attributes:
        env_id: id the API gave this env at registration (None before / outside serve mode).
        curr_step: trainer step the runner last saw.
        status: the last ``/status-env`` answer (empty until one is read).
        stats: counters of sent, dropped and failed groups (``Counter[str]``).
        max_seq_len: the trainer's longest sequence (prompt + completion) in tokens, -1 =
            unknown (the trainer registers it as ``max_token_len``).
        batch_size: trainer's batch size in sequences (-1 = unknown).
        total_steps: steps to run (-1 = take from the trainer; <= 0 in process mode = until
            ``get_next_item`` runs dry).
        wandb_prepend: W&B prefix the API gave this env.
        checkpoint_dir: where env checkpoints go (None = none).
        checkpoint_interval: trainer steps between checkpoints (-1 = never).
        items_sent_this_step: groups sent since the last metrics log.
        completion_lengths: trained tokens per accepted sequence, since the last metrics log.
        task_durations: seconds per rollout group (last 1000).
        sinks: local outputs every accepted group is written to (JSONL, W&B), objects with
            ``async write(group, item)`` and ``async close()``.
        outbox: the sink that queues groups for the API (serve mode only).
        eval_mode: running ``evaluate`` mode (evaluation files are always written).
        drops: groups sampled and then dropped by the env's checks, not yet reported to
            run-api's ledger (the outbox attaches them to the next group it sends).
    """

    env_id: int | None = None
    curr_step: int = 0
    status: dict[str, Any] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)
    max_seq_len: int = -1
    batch_size: int = -1
    total_steps: int = -1
    wandb_prepend: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_interval: int = -1
    items_sent_this_step: int = 0
    completion_lengths: list[int] = field(default_factory=list)
    task_durations: deque[float] = field(default_factory=lambda: deque(maxlen=1000))
    sinks: list[Any] = field(default_factory=list)
    outbox: Any = None
    eval_mode: bool = False
    drops: DropTally = field(default_factory=DropTally)

    @classmethod
    def for_config(cls, config: Any, **values: Any) -> RunState:
        """A fresh state with ``batch_size``/``total_steps`` from the env config (overridable)."""
        return cls(**{"batch_size": config.batch_size, "total_steps": config.total_steps, **values})

    def record_accepted(self, group: Any) -> None:
        """Count one accepted group and record its trained-token lengths (the last 10,000)."""
        self.stats["groups_accepted"] += 1
        self.completion_lengths.extend(completion_lengths(group))
        del self.completion_lengths[: max(0, len(self.completion_lengths) - 10_000)]

    def accept(self, groups: Iterable[Any], include_messages: bool,
               decode: Callable[[list[int]], str]) -> list[Any]:
        """Normalise checked ``groups`` in place for sending and record each; returns them.

        ``groups`` passed the scored-group check already
        (:func:`~atroposlib.envs.groups.check_groups`); each gets every optional key
        (:func:`~atroposlib.envs.groups.normalise_group`, ``decode`` turning tokens into a
        transcript when ``include_messages`` and it has none) and is counted
        (:meth:`record_accepted`).
        """
        accepted = []
        for group in groups:
            normalise_group(group, include_messages, decode)
            self.record_accepted(group)
            accepted.append(group)
        return accepted


class RunStateView:
    """Read-only view of a :class:`RunState` (``env.run_state``); assignments raise."""

    __slots__ = ("_state",)

    def __init__(self, state: RunState):
        object.__setattr__(self, "_state", state)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_state"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"run_state.{name} is owned by the runner and read-only for the env; runners "
            "write the RunState they bound with env.bind_run_state(state)"
        )

    def __repr__(self) -> str:
        return f"RunStateView({object.__getattribute__(self, '_state')!r})"


def batch_share(batch_size: int, status: dict[str, Any], min_batch_allocation: float | None) -> int:
    """This env's share of a trainer batch, in sequences (``derived_batch_size``).

    ``int(batch_size * (status["unallocated_fraction"] + (min_batch_allocation or 0)))``, the
    fraction defaulting to 1.0 when the ``/status-env`` answer lacks it.
    """
    share = status.get("unallocated_fraction", 1.0) + (min_batch_allocation or 0)
    return int(batch_size * share)


def state_property(name: str) -> property:
    """A read-only env attribute that reads ``RunState.<name>`` (Atropos-compatible names)."""

    def get(self: Any) -> Any:
        return getattr(self._run_state, name)

    def set_(self: Any, value: Any) -> None:
        raise AttributeError(
            f"{type(self).__name__}.{name} is read-only: the runner owns it. Read it from "
            f"env.run_state.{name}; a runner (or a test) sets it on the RunState it bound "
            "with env.bind_run_state(state)"
        )

    return property(get, set_, doc=f"``RunState.{name}`` (read-only; the runner owns it).")


RUN_STATE_FIELDS = tuple(f.name for f in fields(RunState))

__all__ = ["ROLLOUT_POLICY_VERSION", "RUN_STATE_FIELDS", "RunState", "RunStateView", "batch_share",
           "state_property"]
