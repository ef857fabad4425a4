"""Unit and property tests of the pure packing functions (no HTTP)."""

from __future__ import annotations

import itertools
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from atroposlib.api.packing import (
    allocation_needs,
    batch_size_problem,
    find_subset,
    pack_with_minimums,
)


def brute_force_earliest(sizes: list[int], target: int) -> list[int] | None:
    """Lexicographically smallest ascending index list summing to target (exhaustive)."""
    best = None
    n = len(sizes)
    for r in range(n + 1):
        for combo in itertools.combinations(range(n), r):
            if sum(sizes[i] for i in combo) == target and (best is None or list(combo) < best):
                best = list(combo)
    return best


sizes_st = st.lists(st.integers(1, 8), max_size=10)


@given(sizes_st, st.integers(1, 24))
@settings(max_examples=300, deadline=None)
def test_find_subset_matches_brute_force(sizes: list[int], target: int) -> None:
    expected = brute_force_earliest(sizes, target)
    got = find_subset(sizes, target)
    assert got == expected
    if got is not None:
        assert sum(sizes[i] for i in got) == target
        assert got == sorted(set(got))


@given(st.lists(st.integers(1, 16), max_size=60), st.integers(1, 64))
@settings(max_examples=300, deadline=None)
def test_batch_is_exact_fifo_and_never_wedges(sizes: list[int], batch_size: int) -> None:
    got = find_subset(sizes, batch_size)
    reachable = {0}
    for s in sizes:
        reachable |= {r + s for r in reachable if r + s <= batch_size}
    if batch_size in reachable:
        assert got is not None, "a subset sums to batch_size but none was returned (wedge)"
        assert sum(sizes[i] for i in got) == batch_size
        assert got == sorted(got), "batch must keep FIFO order"
    else:
        assert got is None


def test_upstream_wedge_case_is_served() -> None:
    # Atropos 0.4 returned null forever for sizes [1,1,1,1,1,3] with batch 4
    assert find_subset([1, 1, 1, 1, 1, 3], 4) == [0, 1, 2, 3]
    # a head group that fits no batch does not block later ones
    assert find_subset([3, 2, 2], 4) == [1, 2]
    assert find_subset([5, 4], 4) == [1]


def test_edge_cases() -> None:
    assert find_subset([], 4) is None
    assert find_subset([1, 2], 0) == []
    assert find_subset([0, 4], 4) == [1]
    assert find_subset([2, 2], -1) is None


def test_large_queue_is_fast() -> None:
    # 10k groups of size 3 can never make 64 (DP path), plus the worst case for the greedy pass
    sizes = [3] * 10_000
    start = time.perf_counter()
    assert find_subset(sizes, 64) is None
    assert find_subset([*sizes, 1], 64) == [*range(21), 10_000]
    # greedy overshoots (1365 x 3 = 4095), the DP finds 1364 x 3 + 2 + 2
    assert find_subset([3] * 10_000 + [2, 2], 4096) == [*range(1364), 10_000, 10_001]
    assert time.perf_counter() - start < 5.0  # generous bound: catches an accidental O(n^2)


def brute_force_minimums(sizes, envs, target, needs):
    n = len(sizes)
    best = None
    for r in range(n + 1):
        for combo in itertools.combinations(range(n), r):
            if sum(sizes[i] for i in combo) != target:
                continue
            ok = all(sum(sizes[i] for i in combo if envs[i] == e) >= need for e, need in needs.items())
            if ok and (best is None or list(combo) < best):
                best = list(combo)
    return best


@given(
    st.lists(st.tuples(st.integers(1, 6), st.sampled_from([None, 0, 1, 2])), max_size=9),
    st.integers(1, 16),
    st.dictionaries(st.sampled_from([0, 1]), st.integers(0, 8), max_size=2),
)
@settings(max_examples=300, deadline=None)
def test_minimums_feasibility_matches_brute_force(items, batch_size, needs) -> None:
    sizes = [s for s, _ in items]
    envs = [e for _, e in items]
    expected = brute_force_minimums(sizes, envs, batch_size, needs)
    got = pack_with_minimums(sizes, envs, batch_size, needs)
    assert (got is None) == (expected is None)
    if got is not None:
        assert sum(sizes[i] for i in got) == batch_size
        assert got == sorted(set(got))
        for env, need in needs.items():
            assert sum(sizes[i] for i in got if envs[i] == env) >= need


def test_minimums_prefer_unconstrained_fifo_when_it_satisfies() -> None:
    sizes = [2, 2, 2, 2]
    envs = [0, 1, 0, 1]
    assert pack_with_minimums(sizes, envs, 4, {0: 2, 1: 2}) == [0, 1]
    # env 1 needs 4 sequences: its two groups must be taken
    assert pack_with_minimums(sizes, envs, 4, {1: 4}) == [1, 3]


def test_allocation_needs_scaling() -> None:
    assert allocation_needs(8, {0: 0.25, 1: 0.5}, {}) == {0: 2, 1: 4}
    # min 1.5 of batch 4 -> need 6 > 4 -> scaled to 4
    assert allocation_needs(4, {0: 1.5}, {0: 1}) == {0: 4}
    # scaled needs never go below the env's smallest group
    assert allocation_needs(4, {0: 1.0, 1: 1.0}, {0: 1, 1: 4}) == {0: 2, 1: 4}
    assert allocation_needs(2, {0: 0.3}, {}) == {}


def test_exact_search_only_considers_the_window_of_oldest_groups() -> None:
    from atroposlib.api.packing import search_limit_note, search_window

    # greedy takes 2+2 and fails; the earliest exact subset is [0, 3]. At most 5 // 2 = 2 groups
    # of size 2 can be used, so the search needs 3 candidates: [2, 2, 3]
    sizes = [2, 2, 2, 3]
    assert find_subset(sizes, 5) == [0, 3]
    assert find_subset(sizes, 5, max_cells=18) == [0, 3]  # 3 candidates x 6 sums fit the bound
    # a bound of 2 groups x 6 sums keeps the 2 oldest candidates only: no exact subset there
    assert search_window(3, 5, max_cells=12) == 2
    assert find_subset(sizes, 5, max_cells=12) is None
    note = search_limit_note(sizes, 5, max_cells=12)
    assert note is not None and "oldest 2 of the 3" in note
    assert search_limit_note(sizes, 5) is None  # the default bound sees every group
    assert pack_with_minimums(sizes, [0, 0, 0, 1], 5, {1: 3}, max_cells=12) is None
    assert pack_with_minimums(sizes, [0, 0, 0, 1], 5, {1: 3}) == [0, 3]


def test_huge_batch_size_is_bounded_and_says_why() -> None:
    from atroposlib.api.packing import MAX_SEARCH_CELLS, search_limit_note, search_window

    # 1000 groups whose sizes are all even, an odd batch_size of 10**6: no greedy answer, and an
    # unbounded table would be 1000 x 10**6 cells (125 MB of bitsets)
    sizes = [1000 + 2 * (i % 7) for i in range(1000)]
    window = search_window(len(sizes), 10**6 + 1)
    assert window * (10**6 + 2) <= MAX_SEARCH_CELLS and window == 33
    assert find_subset(sizes, 10**6 + 1) is None
    assert "considered only the oldest 33 of the 1000" in search_limit_note(sizes, 10**6 + 1)
    # a batch_size whose single row is over the bound searches nothing beyond the greedy pass
    assert search_window(10, MAX_SEARCH_CELLS) == 0
    assert find_subset([2, 2], MAX_SEARCH_CELLS + 1) is None


def test_batch_size_problem_names_both_numbers_and_the_fix():
    assert batch_size_problem(32, [8]) is None
    assert batch_size_problem(8, [3, 5]) is None  # one group of each fills it
    message = batch_size_problem(12, [8])
    assert message is not None and "batch_size 12" in message and "group_size 8" in message
    assert "multiple of 8 (e.g. 8 or 16)" in message
    assert "[4, 6]" in (batch_size_problem(7, [4, 6, 4]) or "")


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.lists(st.integers(1, 16), min_size=1, max_size=3))
def test_batch_size_problem_matches_brute_force(batch_size, sizes):
    reachable = {0}
    for total in range(1, batch_size + 1):
        if any(total - s in reachable for s in sizes):
            reachable.add(total)
    assert (batch_size_problem(batch_size, sizes) is None) == (batch_size in reachable)
