"""The memory blocks: the quickstart's LoRA loop against TRL with LoRA, pair by pair."""

from __future__ import annotations

from benchmarks.docs_tables import MEMORY_LORA, MEMORY_LORA_HF, MEMORY_VLLM_FP32, memory_hf_table
from benchmarks.docs_tables import memory_lora_table as renderer

memory_lora_table = renderer(MEMORY_LORA)

GIB = 2**30


def _run(label: str, passno: int, rss: float, pss: float, accuracy: float, parts: dict | None = None,
         trl: dict | None = None) -> dict:
    return {"label": label, "pass": passno, "peak_rss_bytes": rss * GIB, "peak_pss_bytes": pss * GIB,
            "rss_by_part_at_peak": {k: v * GIB for k, v in (parts or {"trl": rss}).items()},
            "trl_setting": trl, "steps": 20 if trl else 30 + 5 * (passno - 1), "curve": [{"minute": 0.0, "accuracy": 0.3}, {"minute": 4.0, "accuracy": accuracy}]}


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
            "run-api 0.10. TRL is one process (mean peak 2.77).") in text
    assert ("Held-out accuracy at 4 minutes: ours 70.0-80.0% (n=2), TRL 50.0-60.0% (n=2); steps: "
            "ours 30-35 (n=2), TRL 20 (n=2).") in text


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


def _hf_payload() -> dict:
    payload = _payload()
    payload["meta"]["machine"]["cpu_native_bf16"] = True
    for run in payload["runs"]:
        if run["label"] == "ours-gspo-lora":
            run["rss_by_part_at_peak"] = {"trainer": 1.5 * GIB, "env": 0.2 * GIB, "run-api": 0.1 * GIB,
                                          "launcher": 0.05 * GIB}
            # a bare `no` in YAML 1.1 is False; the trainer reads it as "no"
            run["trainer_args"] = {"rollout_engine": "hf", "mixed_precision": False}
    return payload


def test_the_in_process_sampler_run_lists_only_its_parts_and_says_fp32_when_it_set_it():
    text = renderer(MEMORY_LORA_HF, "ours (LoRA, hf sampler)")(_hf_payload())
    assert text.startswith("4-minute runs, fp32 on both sides")
    assert "| pair | ours (LoRA, hf sampler), GiB |" in text
    assert "(GiB, mean of 2 runs): trainer 1.50, env 0.20, run-api 0.10, launcher 0.05. TRL" in text
    assert text.endswith(f"Source: `benchmarks/results/{MEMORY_LORA_HF}`.")


def test_the_hf_block_sets_the_vllm_run_of_the_same_machine_beside_the_pairs():
    vllm = {"task": {"minutes": 4.0}, "runs": [_run("ours-gspo-lora", 1, 3.9, 3.5, 0.65)]}
    vllm["runs"][0]["steps"] = 41
    text = memory_hf_table(_hf_payload(), vllm)
    assert ("The same loop sampling from vLLM instead (the quickstart's way), on the same machine in "
            "the same precision: steps 41 (n=1) in 4 minutes, peak RSS 3.90 GiB (n=1), held-out "
            "accuracy at 4 minutes 65.0% (n=1).") in text
    assert text.endswith(f"Source: `benchmarks/results/{MEMORY_LORA_HF}`, "
                         f"`benchmarks/results/{MEMORY_VLLM_FP32}`.")
    assert text.count("Source:") == 1
