"""The precision block of docs/benchmarks.md: bf16 against fp32 on one machine."""

from __future__ import annotations

from benchmarks.docs_outcomes import PRECISION, precision_table

GIB = 2**30


def _payload(steps: int, accuracy: float, native: bool | None) -> dict:
    return {"meta": {"machine": {"cpu_native_bf16": native}},
            "runs": [{"steps": steps, "peak_rss_bytes": 3 * GIB,
                      "peak_rss_by_part": {"trainer": GIB, "vllm-engine": 1.5 * GIB},
                      "curve": [{"minute": 0.0, "accuracy": 0.3}, {"minute": 7.0, "accuracy": accuracy}]}]}


def test_each_precision_gets_its_curve_steps_and_memory():
    text = precision_table(_payload(17, 0.5, False), _payload(66, 0.75, False))
    assert "| bf16 autocast, bf16 vLLM | 0 min 0.300  7 min 0.500 | 17 | 3.00 | 1.00 | 1.50 |" in text
    assert "| fp32 trainer, fp32 vLLM | 0 min 0.300  7 min 0.750 | 66 | 3.00 | 1.00 | 1.50 |" in text
    assert "so bf16 was emulated" in text and all(f"benchmarks/results/{f}" in text for f in PRECISION)


def test_emulation_is_claimed_only_when_both_runs_recorded_a_cpu_without_native_bf16():
    assert "emulated" not in precision_table(_payload(17, 0.5, None), _payload(66, 0.75, False))
    assert "emulated" not in precision_table(_payload(17, 0.5, True), _payload(66, 0.75, True))
