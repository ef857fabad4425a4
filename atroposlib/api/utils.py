"""Atropos 0.4's batching helpers (same names and signatures), on top of the never-wedging packer.

These work on plain lists of group dicts (each with a ``tokens`` list of sequences, and an
``env_id`` for the minimum-allocation helper), as upstream's white-box tests call them. The
server itself uses :mod:`atroposlib.api.packing` on sizes only.

Results:

* a batch is formed whenever *any* subset of the queue sums to ``batch_size`` (e.g. sizes
  ``[1, 1, 1, 1, 1, 3]`` with batch 4 give ``[0, 1, 2, 3]``);
* groups inside a batch keep queue (FIFO) order;
* in minimum-allocation mode, groups without ``env_id`` are batched like any other.

As in Atropos 0.4, an env with a minimum must have queued at least one complete "pack" (groups
of one size from that env adding up to the largest group size in the queue) before the
minimum-allocation helper forms a batch: e.g. one group of 2 from such an env next to groups of
8 gives None until three more of its groups of 2 arrive. The server does not use these helpers
and does not wait for packs (it batches with :func:`~atroposlib.api.packing.pack_with_minimums`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from atroposlib.api.packing import allocation_needs, find_subset, pack_with_minimums

__all__ = [
    "find_groups_summing_to_target",
    "grab_batch_with_minimum_allocations",
    "grab_exact_from_heterogeneous_queue",
]


def _size(item: Any) -> int:
    """Sequences in a group dict (``len(tokens)``); an int is taken as the size itself."""
    if isinstance(item, int):
        return item
    tokens = item["tokens"] if isinstance(item, Mapping) else item.tokens
    return len(tokens)


def _field(obj: Any, name: str, default: Any = None) -> Any:
    return obj.get(name, default) if isinstance(obj, Mapping) else getattr(obj, name, default)


def find_groups_summing_to_target(buffer: Sequence[Any], target: int) -> list[int]:
    """Return indices of buffered groups whose sizes sum exactly to ``target``.

    Args:
        buffer: groups (dicts with ``tokens``) or plain sizes, oldest first.
        target: sequences wanted (an env's group_size).

    Returns:
        The lexicographically earliest ascending index list (FIFO greedy when it works, else an
        exact subset-sum), or ``[]`` when no subset sums to ``target``.
    """
    return find_subset([_size(g) for g in buffer], target) or []


def grab_exact_from_heterogeneous_queue(
    queue: list[Any], batch_size: int
) -> tuple[list[Any] | None, list[Any]]:
    """Take groups summing to exactly ``batch_size`` sequences from a mixed-size queue.

    Args:
        queue: groups (dicts with ``tokens``), oldest first.
        batch_size: sequences per batch.

    Returns:
        ``(batch, new_queue)``: the chosen groups in queue order and the queue without them, or
        ``(None, queue)`` when no subset of the queue sums to ``batch_size``.
    """
    if not queue:
        return None, queue
    picked = find_subset([_size(g) for g in queue], batch_size)
    if not picked:
        return None, queue
    taken = set(picked)
    return [queue[i] for i in picked], [g for i, g in enumerate(queue) if i not in taken]


def _has_complete_pack(sizes: Sequence[int], env_ids: Sequence[Any], env: Any) -> bool:
    """Whether ``env`` queued groups of one size ``s`` adding up to the largest group size.

    That is ``largest % s == 0`` and at least ``largest // s`` of its groups have size ``s``.
    """
    largest = max(sizes, default=0)
    counts: dict[int, int] = {}
    for size, owner in zip(sizes, env_ids, strict=True):
        if owner == env and size > 0:
            counts[size] = counts.get(size, 0) + 1
    return any(largest % s == 0 and n >= largest // s for s, n in counts.items())


def grab_batch_with_minimum_allocations(
    queue: list[Any], batch_size: int, env_configs: Sequence[Any]
) -> tuple[list[Any] | None, list[Any]]:
    """Like :func:`grab_exact_from_heterogeneous_queue`, honouring envs' minimum allocations.

    Each connected env with a ``min_batch_allocation`` gets at least
    ``int(batch_size * min_batch_allocation)`` sequences of the batch (scaled down as upstream
    when the minimums add up to more than the batch; see
    :func:`atroposlib.api.packing.allocation_needs`).

    Args:
        queue: groups (dicts with ``tokens`` and ``env_id``), oldest first.
        batch_size: sequences per batch.
        env_configs: env records (dicts or objects) with ``registered_id``,
            ``min_batch_allocation`` and ``connected``.

    Returns:
        ``(batch, new_queue)`` as :func:`grab_exact_from_heterogeneous_queue`; ``(None, queue)``
        when no batch satisfies every minimum, or an env with a minimum has no complete pack
        queued (see the module docstring; e.g. it has nothing queued).
    """
    if not queue:
        return None, queue
    minimums: dict[int, float] = {}
    for i, cfg in enumerate(env_configs):
        value = _field(cfg, "min_batch_allocation")
        if value is not None and _field(cfg, "connected", True):
            env_id = _field(cfg, "registered_id", i)
            minimums[env_id] = value
    if not minimums:
        return grab_exact_from_heterogeneous_queue(queue, batch_size)
    sizes = [_size(g) for g in queue]
    env_ids = [_field(g, "env_id") for g in queue]
    smallest: dict[int, int] = {}
    for size, env in zip(sizes, env_ids, strict=True):
        if env in minimums:
            smallest[env] = min(smallest.get(env, size), size)
    needs = allocation_needs(batch_size, minimums, smallest)
    wanting = [e for e, fraction in minimums.items() if int(batch_size * fraction) > 0]
    if not all(_has_complete_pack(sizes, env_ids, env) for env in wanting):
        return None, queue
    picked = pack_with_minimums(sizes, env_ids, batch_size, needs)
    if not picked:
        return None, queue
    taken = set(picked)
    return [queue[i] for i in picked], [g for i, g in enumerate(queue) if i not in taken]
