"""Rejection sampling (SFT) and preference pairing (DPO) over the scores of one rollout group."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence


def select_for_sft(
    scores: Sequence[float],
    *,
    top_n: int = 3,
    allow_negative_scores: bool = False,
    minimum_score_diff_max_min: float = 0.0,
) -> list[int]:
    """Pick the rollouts of a group worth keeping as SFT examples (rejection sampling).

    The rule is Atropos 0.4's ``atropos-sft-gen``: sort by score, descending; drop
    scores <= 0 unless ``allow_negative_scores``; when ``minimum_score_diff_max_min > 0`` keep only
    rollouts with ``score - min(scores) > minimum_score_diff_max_min``; keep the first ``top_n``.
    Non-finite scores are never selected.

    Args:
        scores: ``[G]`` one scalar reward per rollout of the group.
        top_n: keep at most this many rollouts (``--save-top-n-per-group``); 0 keeps none.
        allow_negative_scores: also keep rollouts whose score is <= 0.
        minimum_score_diff_max_min: required margin over the group's lowest score (0 = off).

    Returns:
        Indices into ``scores``, best first (ties keep their group order).

    Raises:
        ValueError: ``top_n`` is negative.
    """
    if top_n < 0:
        raise ValueError(f"top_n must be >= 0, got {top_n}; pass --save-top-n-per-group 1 or more")
    finite = [i for i, s in enumerate(scores) if math.isfinite(s)]
    if not finite:
        return []
    lowest = min(scores[i] for i in finite)
    ranked = sorted(finite, key=lambda i: -scores[i])
    kept = [
        i
        for i in ranked
        if (allow_negative_scores or scores[i] > 0)
        and (minimum_score_diff_max_min <= 0 or scores[i] - lowest > minimum_score_diff_max_min)
    ]
    return kept[:top_n]


def pair_for_dpo(
    scores: Sequence[float],
    *,
    n_pairs: int = 3,
    allow_negative_scores: bool = False,
    minimum_score_diff_max_min: float = 0.5,
    rng: random.Random | None = None,
) -> list[tuple[int, int]]:
    """Build (chosen, rejected) preference pairs from the scores of one group.

    The rule is Atropos 0.4's ``atropos-dpo-gen``: chosen candidates are the rollouts
    sorted by score, descending, without scores <= 0 unless ``allow_negative_scores``; the
    rejected pool is the ``n_pairs`` lowest-scored rollouts. For each of the first
    ``min(n_pairs, len(chosen))`` candidates, a rejected rollout is drawn at random from the pool
    entries scoring below ``chosen - minimum_score_diff_max_min`` and removed from the pool; a
    candidate without such an entry gets no pair. A rollout is never paired with itself.

    Args:
        scores: ``[G]`` one scalar reward per rollout of the group.
        n_pairs: at most this many pairs (``--save-n-pairs-per-group``).
        allow_negative_scores: let rollouts with score <= 0 be chosen.
        minimum_score_diff_max_min: required score margin between chosen and rejected.
        rng: source of randomness (``random.Random(seed)`` for reproducible output).

    Returns:
        ``(chosen_index, rejected_index)`` pairs, best chosen first; ``scores[chosen] -
        scores[rejected] > minimum_score_diff_max_min`` holds for each.

    Raises:
        ValueError: ``n_pairs`` is negative.
    """
    if n_pairs < 0:
        raise ValueError(f"n_pairs must be >= 0, got {n_pairs}; pass --save-n-pairs-per-group 1 or more")
    rng = rng or random.Random()
    finite = [i for i, s in enumerate(scores) if math.isfinite(s)]
    chosen = [
        i for i in sorted(finite, key=lambda i: -scores[i]) if allow_negative_scores or scores[i] > 0
    ]
    pool = sorted(finite, key=lambda i: scores[i])[:n_pairs]
    pairs: list[tuple[int, int]] = []
    for c in chosen[: min(n_pairs, len(chosen))]:
        candidates = [
            j for j in pool if j != c and scores[j] < scores[c] - minimum_score_diff_max_min
        ]
        if not candidates:
            continue
        rejected = rng.choice(candidates)
        pool.remove(rejected)
        pairs.append((c, rejected))
    return pairs
