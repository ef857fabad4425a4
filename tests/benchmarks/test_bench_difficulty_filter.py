"""The difficulty-filter benchmark's table of the screen's signal against what groups did."""

from __future__ import annotations

import math

import pytest

from tests.fixtures.bench_scripts import load_bench


def test_signal_fifths_rank_groups_by_their_answer_probability():
    bench = load_bench("bench_difficulty_filter.py")
    # 10 groups of 8: the higher the answer's probability, the more replies solved
    pairs = [(math.log(q), solved, 8) for q, solved in
             [(0.9, 8), (1e-6, 0), (0.5, 4), (0.99, 8), (1e-4, 0), (0.3, 2), (0.7, 7), (0.01, 1),
              (0.05, 0), (0.6, 5)]]
    fifths = bench.signal_fifths(pairs)
    assert [f["answer_probability"] for f in fifths] == [
        [1e-6, 1e-4], [0.01, 0.05], [0.3, 0.5], [0.6, 0.7], [0.9, 0.99]]
    assert [f["solved_share"] for f in fifths] == [0.0, 0.062, 0.375, 0.75, 1.0]
    assert [f["all_same_share"] for f in fifths] == [1.0, 0.5, 0.0, 0.0, 1.0]


def test_arm_overrides_apply_all_arms_args_everywhere_and_env_args_to_the_on_arm():
    bench = load_bench("bench_difficulty_filter.py")
    env_args = ["item_filter.screen=8", "group_size=16", "item_filter.screen_rule=weighted"]
    common = ["group_size=4", "temperature=0.8"]
    assert bench.arm_overrides("off", env_args, common) == {"group_size": 4, "temperature": 0.8}
    assert bench.arm_overrides("signal", env_args, []) == {}
    assert bench.arm_overrides("on", env_args, common) == {
        "group_size": 16, "temperature": 0.8, "item_filter": {"screen": 8, "screen_rule": "weighted"}}
    assert bench.arm_overrides("on", env_args, ["item_filter.floor=0.1"])["item_filter"] == {
        "floor": 0.1, "screen": 8, "screen_rule": "weighted"}
    assert bench.arm_overrides("on", ["item_filter.screen=8", "item_filter.screen_signal=features"], []) == {
        "item_filter": {"screen": 8, "screen_signal": "features"}}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        bench.arm_overrides("off", [], ["group_size"])
