"""The memory blocks: the quickstart's LoRA loop against TRL with LoRA, pair by pair."""

from __future__ import annotations

from benchmarks.docs_tables import MEMORY_LORA, memory_lora_table

GIB = 2**30


def _run(label: str, passno: int, rss: float, pss: float, accuracy: float, parts: dict | None = None,
         trl: dict | None = None) -> dict:
    return {"label": label, "pass": passno, "peak_rss_bytes": rss * GIB, "peak_pss_bytes": pss * GIB,
            "rss_by_part_at_peak": {k: v * GIB for k, v in (parts or {"trl": rss}).items()},
            "trl_setting": trl, "curve": [{"minute": 0.0, "accuracy": 0.3}, {"minute": 4.0, "accuracy": accuracy}]}


def _payload() -> dict:
    trl = {"lr": 3e-4, "bf16": False, "level": "token", "lora_r": 16}
    label = "trl-lr0.0003-fp32-token-lora16"
    ours = [_run("ours-gspo-lora", p, rss, rss - 0.5, acc,
                 {"trainer": 1.4, "vllm-engine": engine, "vllm-api": 0.7, "env": 0.2, "run-api": 0.1})
            for p, rss, engine, acc in ((1, 4.2, 1.8, 0.7), (2, 4.4, 2.0, 0.8))]
    theirs = [_run(label, p, rss, rss - 0.1, acc, trl=trl) for p, rss, acc in ((1, 2.8, 0.5), (2, 2.75, 0.6))]
    return {"meta": {"machine": {"cpu_native_bf16": False}}, "task": {"minutes": 4.0}, "runs": ours + theirs,
            "contenders": {"ours-gspo-lora": {}, label: {"trl_setting": trl}}}


def test_each_pair_gets_both_peaks_and_its_ratios():
    text = memory_lora_table(_payload())
    # pair 1: 4.2 / 2.8 = 1.50x RSS, 3.7 / 2.7 = 1.37x PSS; pair 2: 4.4 / 2.75 = 1.60x, 3.9 / 2.65 = 1.47x
    assert "| 1 | 4.20 | 2.80 | 1.50x | 1.37x |" in text
    assert "| 2 | 4.40 | 2.75 | 1.60x | 1.47x |" in text
    assert "RSS 1.50-1.60x (n=2), PSS 1.37-1.47x (n=2); the goal, at most 1.1x, is not met." in text
    assert text.startswith("4-minute runs, fp32 on both sides")
    assert text.endswith(f"Source: `benchmarks/results/{MEMORY_LORA}`.")


def test_the_loop_parts_are_averaged_and_accuracy_stands_beside_memory():
    text = memory_lora_table(_payload())
    assert ("(GiB, mean of 2 runs): trainer 1.40, vllm-engine 1.90, vllm-api 0.70, env 0.20, "
            "run-api 0.10, launcher 0.00. TRL is one process (mean peak 2.77).") in text
    assert "Held-out accuracy at 4 minutes: ours 70.0-80.0% (n=2), TRL 50.0-60.0% (n=2)." in text


def test_the_goal_is_met_only_when_every_pair_meets_it():
    payload = _payload()
    for run in payload["runs"]:
        if run["label"] == "ours-gspo-lora":
            run["peak_rss_bytes"] = 3.0 * GIB
    assert "the goal, at most 1.1x, is met." in memory_lora_table(payload)
    payload["runs"][1]["peak_rss_bytes"] = 3.1 * GIB  # pair 2: 3.1 / 2.75 = 1.13x
    assert "is not met." in memory_lora_table(payload)


def test_fp32_is_claimed_only_where_the_machine_had_no_native_bf16():
    payload = _payload()
    payload["meta"]["machine"]["cpu_native_bf16"] = True  # the quickstart would train in bf16
    assert memory_lora_table(payload).startswith("4-minute runs, each side's configured precision")
