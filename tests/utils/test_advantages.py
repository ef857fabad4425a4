"""utils.advantages: exact return types (upstream tests check them) and GRPO formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from atroposlib.utils.advantages import (
    allclose_to_first,
    compute_discounted_returns,
    compute_grpo_process_supervision_advantages,
    compute_stats,
)


def test_allclose_to_first_types():
    assert allclose_to_first([1.0, 1.0, 1.0 + 1e-10]) is True
    assert allclose_to_first([1.0, 2.0]) is False
    vector = allclose_to_first([[1, 2], [1, 2], [1, 3]], return_vector=True)
    assert isinstance(vector, np.ndarray)
    assert vector.tolist() == [True, True, False]
    assert allclose_to_first([float("nan"), float("nan")], equal_nan=True) is True
    assert allclose_to_first([float("nan"), float("nan")]) is False


def test_compute_stats_jagged_and_errors():
    stats = compute_stats([1, [2, [3, 4]], []])
    assert stats["mean"] == pytest.approx(2.5)
    assert stats["var"] == pytest.approx(1.25)
    with pytest.raises(ValueError):
        compute_stats([])
    with pytest.raises(ValueError):
        compute_stats([[], [[]]])
    with pytest.raises(ValueError):
        compute_stats([1, "x"])


def test_discounted_returns_types_and_values():
    out = compute_discounted_returns([1, 1, 1], 0.5)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert out.tolist() == [1.75, 1.5, 1.0]
    arr = compute_discounted_returns(np.array([0.0, 0.0, 2.0], dtype=np.float64), 0.9)
    assert arr.dtype == np.float64
    assert arr.tolist() == pytest.approx([1.62, 1.8, 2.0])


def test_process_supervision_matches_the_spec_example():
    out = compute_grpo_process_supervision_advantages([[1, 2, 3], [4, 5]])
    assert [a.tolist() for a in out] == [
        pytest.approx([-3 / math.sqrt(2), -1 / math.sqrt(2), 0.0]),
        pytest.approx([3 / math.sqrt(2), 2 / math.sqrt(2)]),
    ]
    with pytest.raises(ValueError, match="std"):
        compute_grpo_process_supervision_advantages([[1, 1], [1]])


@given(st.lists(st.lists(st.floats(-100, 100), min_size=1, max_size=5), min_size=2, max_size=5),
       st.floats(0, 1))
def test_discounted_supervision_first_step_is_discounted_sum(rewards, gamma):
    flat = np.concatenate([np.asarray(r, dtype=np.float64) for r in rewards])
    if flat.std() < 1e-6:
        return
    out = compute_grpo_process_supervision_advantages(rewards, gamma=gamma)
    for traj, adv in zip(rewards, out, strict=True):
        normalised = (np.asarray(traj) - flat.mean()) / flat.std()
        expected = sum(gamma**t * r for t, r in enumerate(normalised))
        assert adv[0] == pytest.approx(expected, rel=1e-6, abs=1e-6)
