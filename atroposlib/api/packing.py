"""Pure batch-packing functions: choose queued groups whose sequences sum exactly to a target.

Groups are atomic (never split), a batch holds exactly ``batch_size`` sequences, and the choice
prefers the oldest groups: among all index subsets that sum to the target, the
lexicographically earliest one (compare sorted index lists). Unlike Atropos 0.4's
pack-to-largest-group heuristic (spec section 1.6), this never wedges: whenever *some* subset of
the queue sums to the target, one is returned.

Algorithm: a FIFO greedy pass (take each group that still fits) answers the common case in
O(groups in the batch); when it fails, a 0/1 subset-sum over suffix reachability bitsets
(Python ints used as bitsets, bit ``s`` set when sum ``s`` is reachable) finds the
lexicographically earliest subset in O(n * target / 64) word operations; 10k queued groups with
a target of 4096 sequences take a few milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["allocation_needs", "find_subset", "pack_with_minimums", "reachable_sums"]


def find_subset(sizes: Sequence[int], target: int) -> list[int] | None:
    """Return the lexicographically earliest indices whose sizes sum exactly to ``target``.

    The greedy FIFO answer, when it succeeds, *is* the lexicographically earliest subset: each
    index it skips does not fit the remaining sum, so no exact subset can contain it.

    Args:
        sizes: ``[n]`` group sizes in queue order (sequences per group). Sizes <= 0 are never
            chosen.
        target: the exact sum wanted (e.g. the batch size in sequences).

    Returns:
        Ascending indices into ``sizes`` summing to ``target`` (``[]`` for a target of 0), or
        None when no subset sums to ``target``.
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
    candidates = [(i, s) for i, s in enumerate(sizes) if 0 < s <= target]
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

    As Atropos 0.4 (spec 1.6 step 5): ``need = int(batch_size * fraction)``; when the needs sum
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

    Returns:
        Ascending indices into ``sizes``, or None when no subset satisfies the sum and all the
        minimums (e.g. an env with a minimum has nothing queued yet).
    """
    needs = {e: n for e, n in needs.items() if n > 0}
    plain = find_subset(sizes, batch_size)
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
    mask = (1 << (batch_size + 1)) - 1
    order = list(needs)
    allowed = []
    for env in order:
        reach = reachable_sums([sizes[i] for i in members.get(env, [])], batch_size)
        allowed.append(reach & ~((1 << needs[env]) - 1))
    combined = [reachable_sums([sizes[i] for i in members.get(None, [])], batch_size)]
    for reach in allowed:
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
        picked = find_subset([sizes[i] for i in idx], amount)
        if picked is None:  # pragma: no cover - guaranteed by the reachability check
            return None
        chosen.extend(idx[j] for j in picked)
    return sorted(chosen)
