"""``bench_fault_curve.py``: the faulty run's curve over the clean one's, and its command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_fault_curve")


def test_ratios_point_by_point(bench):
    clean = [{"minute": 0.0, "accuracy": 0.2}, {"minute": 7.0, "accuracy": 0.6}]
    faults = [{"minute": 0.0, "accuracy": 0.2}, {"minute": 7.0, "accuracy": 0.5}]
    rows = bench.ratios(clean, faults, base=0.2)
    assert rows[0] == {"minute": 0.0, "clean": 0.2, "faults": 0.2, "ratio": 1.0, "gain_ratio": None}
    assert rows[1]["ratio"] == 0.5 / 0.6 and rows[1]["gain_ratio"] == (0.5 - 0.2) / (0.6 - 0.2)
    assert bench.ratios([{"minute": 0.0, "accuracy": 0.0}], [{"minute": 0.0, "accuracy": 0.0}],
                        0.0)[0]["ratio"] is None
    with pytest.raises(ValueError, match="different wall points"):
        bench.ratios(clean, faults[:1], 0.2)


def test_a_bad_fault_spec_stops_before_anything_runs(bench, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--rate", "1.5"])
    assert exit_info.value.code == 2 and "fault rate must be in [0, 1]" in capsys.readouterr().err
