"""Evaluation helpers: pass@k estimator, bounded concurrency, mean metrics."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest

from atroposlib.envs.eval import evaluate_items, mean_metrics, pass_at_k


def test_pass_at_k_matches_the_combinatorial_definition():
    for n, c, k in itertools.product(range(1, 9), range(0, 9), range(1, 9)):
        if c > n or k > n:
            continue
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


async def test_evaluate_items_bounds_concurrency_and_counts_failures():
    active = peak = 0

    async def run(i):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        active -= 1
        if i == 3:
            raise ValueError("bad item")
        return {"correct": i % 2 == 0, "length": i}

    results, failed = await evaluate_items(range(10), run, max_concurrency=3)
    assert peak == 3 and failed == 1 and len(results) == 9
    metrics = mean_metrics(results)
    assert metrics["eval/correct"] == pytest.approx(5 / 9)
    assert metrics["eval/length"] == pytest.approx((45 - 3) / 9)
