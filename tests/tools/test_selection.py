import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from atroposlib.tools.selection import pair_for_dpo, select_for_sft


def test_sft_keeps_top_n_positive_best_first():
    assert select_for_sft([0.5, 1.0, -1.0, 0.0, 0.7], top_n=2) == [1, 4]
    assert select_for_sft([0.5, 1.0, -1.0, 0.0, 0.7], top_n=10) == [1, 4, 0]


def test_sft_zero_and_negative_scores_need_the_flag():
    assert select_for_sft([0.0, -1.0], top_n=3) == []
    assert select_for_sft([0.0, -1.0], top_n=3, allow_negative_scores=True) == [0, 1]


def test_sft_min_diff_is_measured_from_group_minimum():
    scores = [1.0, 0.4, 0.2, -0.5]
    # margins over min (-0.5): 1.5, 0.9, 0.7, 0 -> only > 0.8 survive
    assert select_for_sft(scores, top_n=3, minimum_score_diff_max_min=0.8) == [0, 1]
    # all-equal group has no margin: nothing kept
    assert select_for_sft([1.0, 1.0], top_n=3, minimum_score_diff_max_min=0.1) == []


def test_sft_ties_keep_group_order_and_nan_is_never_selected():
    assert select_for_sft([1.0, float("nan"), 1.0], top_n=3) == [0, 2]


def test_sft_rejects_negative_top_n():
    with pytest.raises(ValueError, match="save-top-n-per-group"):
        select_for_sft([1.0], top_n=-1)


def test_dpo_pairs_best_with_a_low_scored_rollout_beyond_the_margin():
    pairs = pair_for_dpo([1.0, 0.0, 0.9, 0.1], n_pairs=2, minimum_score_diff_max_min=0.5,
                         rng=random.Random(0))
    assert [c for c, _ in pairs] == [0, 2]
    assert sorted(r for _, r in pairs) == [1, 3]  # each rejected used once


def test_dpo_no_pair_when_margin_not_met():
    assert pair_for_dpo([1.0, 0.8, 0.7], n_pairs=3, minimum_score_diff_max_min=0.5) == []
    assert pair_for_dpo([1.0, 1.0], n_pairs=3, minimum_score_diff_max_min=0.0) == []


def test_dpo_negative_chosen_needs_the_flag():
    scores = [-0.1, -2.0]
    assert pair_for_dpo(scores, n_pairs=1, minimum_score_diff_max_min=0.5) == []
    assert pair_for_dpo(scores, n_pairs=1, minimum_score_diff_max_min=0.5,
                        allow_negative_scores=True) == [(0, 1)]


def test_dpo_is_deterministic_under_a_seed_and_random_without():
    scores = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    runs = {tuple(pair_for_dpo(scores, n_pairs=3, rng=random.Random(7))) for _ in range(5)}
    assert len(runs) == 1
    many = {tuple(pair_for_dpo(scores, n_pairs=3, rng=random.Random(s))) for s in range(30)}
    assert len(many) > 1  # the rejected choice is random


@given(
    scores=st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=16),
    n=st.integers(0, 8),
    diff=st.floats(0, 3),
    allow_negative=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_dpo_invariants(scores, n, diff, allow_negative, seed):
    pairs = pair_for_dpo(scores, n_pairs=n, minimum_score_diff_max_min=diff,
                         allow_negative_scores=allow_negative, rng=random.Random(seed))
    assert len(pairs) <= n
    rejected = [r for _, r in pairs]
    assert len(set(rejected)) == len(rejected)
    for c, r in pairs:
        assert c != r
        assert scores[r] < scores[c] - diff
        assert allow_negative or scores[c] > 0


@given(
    scores=st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=16),
    n=st.integers(0, 8),
    diff=st.floats(0, 3),
    allow_negative=st.booleans(),
)
def test_sft_invariants(scores, n, diff, allow_negative):
    kept = select_for_sft(scores, top_n=n, minimum_score_diff_max_min=diff,
                          allow_negative_scores=allow_negative)
    assert len(kept) <= n and len(set(kept)) == len(kept)
    assert [scores[i] for i in kept] == sorted((scores[i] for i in kept), reverse=True)
    for i in kept:
        assert allow_negative or scores[i] > 0
        assert diff <= 0 or scores[i] - min(scores) > diff
    # nothing better than a kept one was left out (top-n among the eligible)
    eligible = [s for s in scores if (allow_negative or s > 0) and (diff <= 0 or s - min(scores) > diff)]
    assert len(kept) == min(n, len(eligible))
