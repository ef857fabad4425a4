"""Pick the best of N candidates by a primary score, breaking ties with a secondary one."""

from __future__ import annotations

from collections.abc import Sequence


def select_best_index(
    primary_scores: Sequence[float],
    secondary_scores: Sequence[float],
    primary_higher_is_better: bool = True,
    secondary_lower_is_better: bool = True,
) -> int:
    """Index of the best candidate: best primary score, ties broken by the secondary score.

    Typical use: best-of-N rollouts ranked by reward, preferring the shorter (fewer tokens)
    among equally rewarded ones. Remaining ties go to the earliest index.

    Args:
        primary_scores: ``[N]`` main criterion (e.g. rewards).
        secondary_scores: ``[N]`` tie-break criterion (e.g. lengths in tokens).
        primary_higher_is_better: a higher primary score is better (else lower).
        secondary_lower_is_better: a lower secondary score wins ties (else higher).

    Returns:
        An index in ``0..N-1``.

    Raises:
        ValueError: a list is empty or the two lengths differ.
    """
    if not primary_scores or not secondary_scores:
        raise ValueError("select_best_index needs non-empty primary_scores and secondary_scores")
    if len(primary_scores) != len(secondary_scores):
        raise ValueError(
            f"primary_scores ({len(primary_scores)}) and secondary_scores "
            f"({len(secondary_scores)}) must have one entry per candidate"
        )
    p_sign = -1.0 if primary_higher_is_better else 1.0
    s_sign = 1.0 if secondary_lower_is_better else -1.0
    return min(
        range(len(primary_scores)),
        key=lambda i: (p_sign * primary_scores[i], s_sign * secondary_scores[i], i),
    )


__all__ = ["select_best_index"]
