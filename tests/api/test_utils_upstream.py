"""Atropos 0.4's expected results for atroposlib.api.utils, on our packer."""

from __future__ import annotations

import random

import pytest

from atroposlib.api.utils import (
    find_groups_summing_to_target,
    grab_batch_with_minimum_allocations,
    grab_exact_from_heterogeneous_queue,
)


def g(n: int, env_id: int | None = None, score: float = 0.0) -> dict:
    return {"tokens": [[1, 2]] * n, "masks": [[-100, 2]] * n, "scores": [score] * n,
            "env_id": env_id}


@pytest.mark.parametrize(
    ("sizes", "target", "expected"),
    [
        ([1, 2, 1], 4, [0, 1, 2]),
        ([2, 2, 4], 4, [0, 1]),
        ([3, 1, 4], 5, [1, 2]),
        ([2, 4], 3, []),
        ([], 4, []),
        ([4], 4, [0]),
        ([2, 2, 2, 2], 8, [0, 1, 2, 3]),
        ([16, 8, 8], 32, [0, 1, 2]),
        ([2, 2, 4, 2, 2], 4, [0, 1]),
        ([2, 4, 2, 1], 6, [0, 1]),
        ([1] * 16, 8, list(range(8))),
    ],
)
def test_find_groups_summing_to_target_upstream_values(sizes, target, expected) -> None:
    assert find_groups_summing_to_target([g(n) for n in sizes], target) == expected


def test_find_groups_any_valid_subset() -> None:
    sizes = [1, 2, 1, 4, 2]
    picked = find_groups_summing_to_target([g(n) for n in sizes], 8)
    assert sum(sizes[i] for i in picked) == 8


def test_grab_exact_random_batches_are_exact() -> None:
    rng = random.Random(1)
    for _ in range(200):
        queue = [g(rng.choice([1, 2, 4, 8])) for _ in range(rng.randrange(0, 20))]
        bs = rng.choice([2, 4, 8, 16])
        batch, rest = grab_exact_from_heterogeneous_queue(queue, bs)
        if batch is not None:
            assert sum(len(x["tokens"]) for x in batch) == bs
            assert len(batch) + len(rest) == len(queue)
        else:
            assert rest == queue


def test_grab_exact_does_not_wedge_where_upstream_did() -> None:
    queue = [g(n, score=i) for i, n in enumerate([1, 1, 1, 1, 1, 3])]
    batch, rest = grab_exact_from_heterogeneous_queue(queue, 4)
    assert [x["scores"][0] for x in batch] == [0, 1, 2, 3]
    assert len(rest) == 2
    # upstream's pack order put idx1 before idx0 for [1, 2, 1]; we keep FIFO order
    queue = [g(n, score=i) for i, n in enumerate([1, 2, 1])]
    batch, _ = grab_exact_from_heterogeneous_queue(queue, 4)
    assert [x["scores"][0] for x in batch] == [0, 1, 2]


def env(i: int, minimum: float | None, connected: bool = True) -> dict:
    return {"registered_id": i, "min_batch_allocation": minimum, "connected": connected}


def count(batch: list[dict], env_id: int | None) -> int:
    return sum(len(x["tokens"]) for x in batch if x["env_id"] == env_id)


def test_minimums_quarter_and_half() -> None:
    queue = [g(1, e) for _ in range(8) for e in (2, 2, 0, 1)]  # env 2 dominates the head
    batch, rest = grab_batch_with_minimum_allocations(queue, 8, [env(0, 0.25), env(1, 0.5), env(2, None)])
    assert sum(len(x["tokens"]) for x in batch) == 8
    assert count(batch, 0) >= 2 and count(batch, 1) >= 4
    assert len(batch) + len(rest) == len(queue)


def test_minimums_scaled_down_still_form_batch() -> None:
    queue = [g(2, 0), g(2, 1)]
    batch, rest = grab_batch_with_minimum_allocations(queue, 4, [env(0, 0.7), env(1, 0.6)])
    assert batch == queue and rest == []


def test_minimum_env_without_items_gives_none_and_keeps_queue() -> None:
    queue = [g(2, 0), g(2, 0)]
    batch, rest = grab_batch_with_minimum_allocations(queue, 4, [env(0, None), env(1, 0.5)])
    assert batch is None and rest == queue


def test_minimum_env_whose_items_cannot_meet_it_gives_none() -> None:
    queue = [g(8, 1), g(2, 0), g(2, 0), g(2, 0)]
    batch, rest = grab_batch_with_minimum_allocations(queue, 8, [env(0, 0.5), env(1, None)])
    assert batch is None and rest == queue


def test_disconnected_minimum_is_ignored() -> None:
    queue = [g(2, 0), g(2, 0)]
    batch, _ = grab_batch_with_minimum_allocations(queue, 4, [env(0, None), env(1, 0.5, connected=False)])
    assert batch == queue


def test_minimum_above_one_uses_whole_batch() -> None:
    queue = [g(1, 0) for _ in range(8)]
    batch, rest = grab_batch_with_minimum_allocations(queue, 4, [env(0, 1.5)])
    assert len(batch) == 4 and len(rest) == 4


def test_exact_half_half() -> None:
    queue = [g(1, 0) for _ in range(8)] + [g(1, 1) for _ in range(8)]
    batch, _ = grab_batch_with_minimum_allocations(queue, 8, [env(0, 0.5), env(1, 0.5)])
    assert count(batch, 0) == 4 and count(batch, 1) == 4


def test_three_quarters_of_sixteen() -> None:
    queue = [g(1, 1) for _ in range(16)] + [g(1, 0) for _ in range(16)]
    batch, _ = grab_batch_with_minimum_allocations(queue, 16, [env(0, 0.75), env(1, None)])
    assert count(batch, 0) >= 12 and sum(len(x["tokens"]) for x in batch) == 16


def test_mixed_minimums_and_none() -> None:
    queue = [g(2, 2) for _ in range(8)] + [g(2, 0) for _ in range(4)] + [g(1, 1) for _ in range(4)]
    batch, _ = grab_batch_with_minimum_allocations(queue, 16, [env(0, 0.4), env(1, 0.2), env(2, None)])
    assert count(batch, 0) >= 6 and count(batch, 1) >= 3
    assert sum(len(x["tokens"]) for x in batch) == 16


def test_dominant_env_without_minimum_fills_batch() -> None:
    queue = [g(1, 0) for _ in range(10)]
    batch, _ = grab_batch_with_minimum_allocations(queue, 10, [env(0, None), env(1, None)])
    assert count(batch, 0) == 10


def test_fallback_keeps_fifo_order() -> None:
    queue = [g(1, 0, score=i) for i in range(8)]
    batch, _ = grab_batch_with_minimum_allocations(queue, 4, [env(0, None)])
    assert [x["scores"][0] for x in batch] == [0, 1, 2, 3]


def test_groups_without_env_id_are_batched_in_minimum_mode() -> None:
    queue = [g(2, None), g(2, 0)]
    batch, _ = grab_batch_with_minimum_allocations(queue, 4, [env(0, 0.5)])
    assert batch == queue


def test_minimum_env_needs_a_complete_pack_of_the_largest_group_size() -> None:
    """As Atropos 0.4's helper: one group of 2 from an env with a minimum, next to groups of 8,
    is not a complete pack (4 x 2 = 8), so no batch yet (though 2 + 3 x 2 + 8 = 16 would fit);
    three more of its groups make one."""
    queue = [g(2, 0)] + [g(2, 6) for _ in range(3)] + [g(8, 3) for _ in range(3)]
    configs = [env(0, 0.1), env(3, 0.5)]
    batch, rest = grab_batch_with_minimum_allocations(queue, 16, configs)
    assert batch is None and rest == queue
    queue += [g(2, 0) for _ in range(3)]
    batch, rest = grab_batch_with_minimum_allocations(queue, 16, configs)
    assert count(batch, 0) >= 2 and count(batch, 3) >= 8 and sum(len(x["tokens"]) for x in batch) == 16
