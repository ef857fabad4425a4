"""Pure batch-packing functions: choose queued groups whose sequences sum exactly to a target.

Groups are atomic (never split), a batch holds exactly ``batch_size`` sequences, and the choice
prefers the oldest groups: among all index subsets that sum to the target, the
lexicographically earliest one (compare sorted index lists). It never wedges: whenever
*some* subset of the queue sums to the target, one is returned.

Algorithm: a FIFO greedy pass (take each group that still fits) answers the common case in
O(groups in the batch); when it fails, a 0/1 subset-sum over suffix reachability bitsets
(Python ints used as bitsets, bit ``s`` set when sum ``s`` is reachable) finds the
lexicographically earliest subset in O(n * target / 64) word operations and n * target bits of
memory. That work is bounded: the table holds at most :data:`MAX_SEARCH_CELLS` cells (groups
considered x (target + 1) sums), so only the oldest ``MAX_SEARCH_CELLS // (target + 1)`` groups
that fit are searched (8191 groups for a target of 4096; about 20 ms and 4 MiB at most), after
dropping the younger copies of a size that cannot all fit (``target // size`` of each). A
subset that exists only among younger groups is then missed, and the caller reports why
(:func:`search_limit_note`) and waits for the queue to change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["MAX_SEARCH_CELLS", "allocation_needs", "batch_size_problem", "find_subset",
           "pack_with_minimums", "reachable_sums", "search_limit_note", "search_window"]

#: Most cells (groups considered x (target + 1) reachable sums) one exact search may touch:
#: 2**25 bits = 4 MiB of bitsets and roughly 20 ms of CPU on one core.
MAX_SEARCH_CELLS = 1 << 25


def search_window(n_candidates: int, target: int, max_cells: int = MAX_SEARCH_CELLS) -> int:
    """How many candidate groups, oldest first, an exact search for ``target`` may consider.

    Args:
        n_candidates: groups the search needs (size in ``1..target``, at most ``target // s``
            of each size ``s``).
        target: the exact sum wanted (sequences).
        max_cells: the work bound (groups x (target + 1) cells).

    Returns:
        ``min(n_candidates, max_cells // (target + 1))``; 0 when even one row is over the bound.
    """
    return min(n_candidates, max_cells // (target + 1))


def _candidates(sizes: Sequence[int], target: int, indices: Sequence[int] | None = None) -> list[int]:
    """Indices (of ``indices``, default all) that an exact search for ``target`` needs.

    Sizes outside ``1..target`` can never be chosen, and at most ``target // s`` groups of size
    ``s`` fit in one answer; the earliest answer uses the oldest ones (swapping a younger group
    for an older unused one of the same size gives an earlier answer), so younger copies are
    dropped without changing the result. Queues with few distinct group sizes shrink to about
    ``target / size`` candidates per size.
    """
    kept: list[int] = []
    count: dict[int, int] = {}
    for i in range(len(sizes)) if indices is None else indices:
        size = sizes[i]
        if 0 < size <= target and count.get(size, 0) < target // size:
            count[size] = count.get(size, 0) + 1
            kept.append(i)
    return kept


def search_limit_note(sizes: Sequence[int], target: int,
                      max_cells: int = MAX_SEARCH_CELLS) -> str | None:
    """Say why an exact search may have missed a subset, or None when it considered every group.

    Args:
        sizes: ``[n]`` group sizes in queue order.
        target: the exact sum wanted.
        max_cells: the work bound used by the search.

    Returns:
        One sentence for the operator (how many of the fitting groups were searched), or None.
    """
    n = len(_candidates(sizes, target))
    window = search_window(n, target, max_cells)
    if window >= n:
        return None
    return (f"the exact search for {target} sequences considered only the oldest {window} of the "
            f"{n} queued groups that fit (work bound {max_cells} cells = groups x (batch_size + 1))"
            "; waiting for the queue to change")


def find_subset(sizes: Sequence[int], target: int,
                max_cells: int = MAX_SEARCH_CELLS) -> list[int] | None:
    """Return the lexicographically earliest indices whose sizes sum exactly to ``target``.

    The greedy FIFO answer, when it succeeds, *is* the lexicographically earliest subset: each
    index it skips does not fit the remaining sum, so no exact subset can contain it. When it
    fails, the exact search considers only the oldest :func:`search_window` fitting groups.

    Args:
        sizes: ``[n]`` group sizes in queue order (sequences per group). Sizes <= 0 are never
            chosen.
        target: the exact sum wanted (e.g. the batch size in sequences).
        max_cells: work bound of the exact search (groups x (target + 1) cells).

    Returns:
        Ascending indices into ``sizes`` summing to ``target`` (``[]`` for a target of 0), or
        None when no subset (of the searched groups) sums to ``target``.
    """
    if target < 0:
        return None
    if target == 0:
        return []
    remaining = target
    chosen: list[int] = []
    for i, size in enumerate(sizes):
        if 0 < size <= remaining:
            chosen.append(i)
            remaining -= size
            if remaining == 0:
                return chosen
    kept = _candidates(sizes, target)
    candidates = [(i, sizes[i]) for i in kept[:search_window(len(kept), target, max_cells)]]
    if sum(s for _, s in candidates) < target:
        return None
    mask = (1 << (target + 1)) - 1
    # suffix[k]: bitset of the sums reachable with candidates[k:]
    suffix = [0] * (len(candidates) + 1)
    reach = suffix[-1] = 1
    for k in range(len(candidates) - 1, -1, -1):
        reach = (reach | (reach << candidates[k][1])) & mask
        suffix[k] = reach
    if not (suffix[0] >> target) & 1:
        return None
    chosen = []
    remaining = target
    for k, (i, size) in enumerate(candidates):
        if size <= remaining and (suffix[k + 1] >> (remaining - size)) & 1:
            chosen.append(i)
            remaining -= size
            if remaining == 0:
                break
    return chosen


def reachable_sums(sizes: Sequence[int], cap: int) -> int:
    """Return the bitset (a Python int) of subset sums of ``sizes`` up to ``cap``; bit 0 is set."""
    mask = (1 << (cap + 1)) - 1
    reach = 1
    for size in sizes:
        if 0 < size <= cap:
            reach = (reach | (reach << size)) & mask
    return reach


def batch_size_problem(batch_size: int, group_sizes: Sequence[int]) -> str | None:
    """Why full groups of these sizes can never make up one batch, or None if they can.

    Groups are atomic and a batch holds exactly ``batch_size`` sequences, so a batch exists only
    if ``batch_size`` is a sum of group sizes (each size usable any number of times). With one
    group size that means ``batch_size % group_size == 0``.

    Args:
        batch_size: the trainer's sequences per step (> 0).
        group_sizes: the group size of every env feeding that trainer.

    Returns:
        None when a batch can be filled; else a message naming both numbers and the fix.
    """
    sizes = sorted({s for s in group_sizes if isinstance(s, int) and s > 0})
    if not sizes or batch_size <= 0:
        return None
    mask = (1 << (batch_size + 1)) - 1
    reach = 1  # bitset of the sums reachable with any number of groups of each size
    for size in sizes:
        for _ in range(batch_size // size):
            reach |= (reach << size) & mask
    if reach >> batch_size & 1:
        return None
    if len(sizes) == 1:
        size = sizes[0]
        lower = batch_size - batch_size % size
        options = f"{lower} or {lower + size}" if lower else f"{size}"
        return (f"batch_size {batch_size} is not a multiple of group_size {size}: full groups "
                f"of {size} can never fill a batch of exactly {batch_size} sequences; use a "
                f"batch_size that is a multiple of {size} (e.g. {options}) or a group_size that "
                f"divides {batch_size}")
    return (f"batch_size {batch_size} is not a sum of the group sizes {sizes}: full groups can "
            f"never fill a batch of exactly {batch_size} sequences; use a batch_size that is a "
            "multiple of one group size, or group sizes that divide the batch_size")


def _convolve(a: int, b: int, mask: int) -> int:
    """Sum-set of two bitsets: bit ``x + y`` for every set bit ``x`` of a and ``y`` of b."""
    out = 0
    while b:
        low = b & -b
        out |= a << (low.bit_length() - 1)
        b ^= low
    return out & mask


def _bits(x: int) -> list[int]:
    """Ascending positions of the set bits of ``x``."""
    out = []
    while x:
        low = x & -x
        out.append(low.bit_length() - 1)
        x ^= low
    return out


def allocation_needs(
    batch_size: int, minimums: Mapping[int, float], smallest_group: Mapping[int, int]
) -> dict[int, int]:
    """Turn ``min_batch_allocation`` fractions into minimum sequence counts per env.

    As Atropos 0.4: ``need = int(batch_size * fraction)``; when the needs sum
    to more than ``batch_size`` each is scaled by ``batch_size / sum`` (truncated), but never
    below the env's smallest queued group.

    Args:
        batch_size: sequences per batch.
        minimums: ``{env_id: fraction}`` for the envs that set one.
        smallest_group: ``{env_id: smallest group size queued by that env}``.

    Returns:
        ``{env_id: minimum sequences}`` (entries with 0 are dropped).
    """
    needs = {e: int(batch_size * m) for e, m in minimums.items()}
    total = sum(needs.values())
    if total > batch_size:
        needs = {
            e: max(int(n * batch_size / total), smallest_group.get(e, 0)) for e, n in needs.items()
        }
    return {e: n for e, n in needs.items() if n > 0}


def pack_with_minimums(
    sizes: Sequence[int],
    env_ids: Sequence[int | None],
    batch_size: int,
    needs: Mapping[int, int],
    max_cells: int = MAX_SEARCH_CELLS,
) -> list[int] | None:
    """Choose groups summing to ``batch_size`` with at least ``needs[e]`` sequences from env e.

    First the unconstrained earliest subset is tried; if it already meets every minimum it is
    returned (the common case). Otherwise each constrained env contributes the smallest
    reachable sum >= its need that still lets the others complete the batch, and within each
    env (and within the pool of unconstrained groups) the earliest subset with that sum is
    taken. Groups without an env id are ordinary pool members (Atropos 0.4 silently never
    batched them in this mode).

    Args:
        sizes: ``[n]`` group sizes (sequences), queue order.
        env_ids: ``[n]`` env id of each group (None for groups sent without one).
        batch_size: exact number of sequences wanted.
        needs: ``{env_id: minimum sequences}`` (see :func:`allocation_needs`).
        max_cells: work bound of each search step: each env's (and the pool's) oldest
            :func:`search_window` fitting groups are considered, and a step that would combine
            more than ``max_cells`` cells gives up (None).

    Returns:
        Ascending indices into ``sizes``, or None when no subset (of the searched groups)
        satisfies the sum and all the minimums (e.g. an env with a minimum has nothing queued).
    """
    needs = {e: n for e, n in needs.items() if n > 0}
    plain = find_subset(sizes, batch_size, max_cells)
    if plain is None or not needs:
        return plain
    taken: dict[int, int] = {}
    for i in plain:
        if env_ids[i] in needs:
            taken[env_ids[i]] = taken.get(env_ids[i], 0) + sizes[i]
    if all(taken.get(e, 0) >= n for e, n in needs.items()):
        return plain
    members: dict[int | None, list[int]] = {}
    for i, env in enumerate(env_ids):
        members.setdefault(env if env in needs else None, []).append(i)
    for key, idx in members.items():
        kept = _candidates(sizes, batch_size, idx)
        members[key] = kept[:search_window(len(kept), batch_size, max_cells)]
    mask = (1 << (batch_size + 1)) - 1
    order = list(needs)
    allowed = []
    for env in order:
        reach = reachable_sums([sizes[i] for i in members.get(env, [])], batch_size)
        allowed.append(reach & ~((1 << needs[env]) - 1))
    combined = [reachable_sums([sizes[i] for i in members.get(None, [])], batch_size)]
    for reach in allowed:
        if reach.bit_count() * (batch_size + 1) > max_cells:
            return None
        combined.append(_convolve(combined[-1], reach, mask))
    if not (combined[-1] >> batch_size) & 1:
        return None
    remaining = batch_size
    share: dict[int | None, int] = {}
    for k in range(len(order) - 1, -1, -1):
        for amount in _bits(allowed[k]):
            if amount <= remaining and (combined[k] >> (remaining - amount)) & 1:
                share[order[k]] = amount
                remaining -= amount
                break
    share[None] = remaining
    chosen: list[int] = []
    for env, amount in share.items():
        idx = members.get(env, [])
        picked = find_subset([sizes[i] for i in idx], amount, max_cells=len(idx) * (amount + 1))
        if picked is None:  # pragma: no cover - guaranteed by the reachability check
            return None
        chosen.extend(idx[j] for j in picked)
    return sorted(chosen)
