"""The arithmetic error breakdown's classes and tally."""

from __future__ import annotations

from tests.fixtures.bench_scripts import load_bench


def test_error_kind_classes_each_wrong_reply():
    bench = load_bench("bench_arithmetic_errors.py")
    kind = bench.error_kind
    assert kind(87, "87", "stop", 1.0) == "right"
    assert kind(87, "87", "length", 0.0) == "truncated"
    assert kind(87, None, "stop", 0.0) == "no number"
    assert kind(-12, "12", "stop", 0.0) == "sign"
    assert kind(53, "63", "stop", 0.0) == "carry"
    assert kind(102, "112", "stop", 0.0) == "carry"
    assert kind(130, "230", "stop", 0.0) == "carry"
    assert kind(34, "36", "stop", 0.0) == "units digit"
    assert kind(53, "98", "stop", 0.0) == "other"


def test_tally_counts_per_operator():
    bench = load_bench("bench_arithmetic_errors.py")
    problems = [{"op": "+"}, {"op": "+"}, {"op": "-"}, {"op": "+"}]
    out = bench.tally(problems, ["right", "carry", "other", "right"])
    assert out["counts"] == {"+": {"right": 2, "carry": 1}, "-": {"other": 1}}
    assert out["accuracy"] == {"+": 0.667, "-": 0.0}
    assert out["n"] == {"+": 3, "-": 1}
