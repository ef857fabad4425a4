"""Evaluation helpers for ``BaseEnv.evaluate``: bounded-concurrency runs, mean metrics, pass@k."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from ``n`` samples of which ``c`` are correct.

    ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021, "Evaluating Large Language Models Trained
    on Code", arXiv:2107.03374, eq. 1), computed as a stable product.

    Raises:
        ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


async def evaluate_items(
    items: Iterable[T],
    run_item: Callable[[T], Awaitable[R]],
    max_concurrency: int = 16,
) -> tuple[list[R], int]:
    """Run ``run_item`` over ``items`` with at most ``max_concurrency`` in flight.

    An item whose ``run_item`` raises is logged and counted, not scored 0.

    Args:
        items: the evaluation items.
        run_item: coroutine function scoring one item (e.g. returns ``{"correct": 1.0}``).
        max_concurrency: in-flight limit (use ``config.max_eval_workers``).

    Returns:
        ``(results in item order, without failures; number of failed items)``.
    """
    semaphore = asyncio.Semaphore(max(1, max_concurrency))

    async def one(item: T) -> tuple[bool, Any]:
        async with semaphore:
            try:
                return True, await run_item(item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a failed eval item is counted, not scored
                logger.warning("eval item failed (%s: %s)", type(exc).__name__, exc)
                return False, None

    outcomes = await asyncio.gather(*(one(item) for item in items))
    results = [value for ok, value in outcomes if ok]
    return results, sum(1 for ok, _ in outcomes if not ok)


def mean_metrics(results: Sequence[Mapping[str, float]], prefix: str = "eval/") -> dict[str, float]:
    """Average each numeric key over ``results`` (keys missing from a result are skipped there).

    Returns:
        ``{prefix + key: mean}``; empty when ``results`` is empty.
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for result in results:
        for key, value in result.items():
            if isinstance(value, (int, float)):  # bools count as 0/1
                sums[key] = sums.get(key, 0.0) + float(value)
                counts[key] = counts.get(key, 0) + 1
    return {f"{prefix}{key}": sums[key] / counts[key] for key in sums}


__all__ = ["evaluate_items", "mean_metrics", "pass_at_k"]
