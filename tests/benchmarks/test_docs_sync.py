"""The delta-sync block of docs/benchmarks.md: medians per push, each goal met or not, sampling."""

from __future__ import annotations

from benchmarks.docs_sync import DELTA_SYNC, delta_sync_table

MIB = 2**20


def _push(nbytes: float, seconds: float, path: str, changed: float = 0.1) -> dict:
    return {"sync/bytes": nbytes, "sync/seconds": seconds, "sync/path": path,
            "sync/changed_fraction": changed}


def _payload() -> dict:
    # lora: delta 3 MiB of 60 (5%) in 0.5 s against a 1.0 s reload; adapter 6 MiB (10%) in 0.1 s
    lora_rows = [{"step": s, "step_seconds": 4.5,
                  "delta": _push(3 * MIB, 0.5, "delta"), "full": _push(60 * MIB, 1.0, "full"),
                  "adapter": _push(6 * MIB, 0.1 * (s - 1), "lora")} for s in (2, 3, 4)]
    # full: delta 30 MiB of 200 (15%) in 4 s against a 2 s reload, on a 6 s step
    full_rows = [{"step": s, "step_seconds": 6.0,
                  "delta": _push(30 * MIB, 4.0, "delta"), "full": _push(200 * MIB, 2.0, "full")}
                 for s in (2, 3, 4)]
    sampling = {key: {"model": "smollm2", "requests": 32, "max_tokens": 48, "tokens_per_second": tps,
                      "runs": [tps, tps, tps]}
                for key, tps in (("plain_merged", 200.0), ("adapter", 120.0), ("lora_server_base", 150.0))}
    return {"steps": 3, "policies": {
        "lora": {"rows": lora_rows, "adapter": {"choice": {"mode": "lora", "adapter_bytes": 6 * MIB,
                                                           "merged_bytes": 60 * MIB}},
                 "sampling": sampling},
        "full": {"rows": full_rows},
        # written since the policies record their spec: the lr joins the label
        "full-rl": {"spec": {"lr": 1e-6}, "rows": [
            {"step": s, "step_seconds": 6.0, "delta": _push(MIB * c, 1.0, "delta", c / 200),
             "full": _push(200 * MIB, 2.0, "full")} for s, c in ((2, 2), (3, 4), (4, 3))]}}}


def test_each_push_gets_its_medians_and_ratios():
    text = delta_sync_table(_payload())
    # the adapter's seconds are 0.1, 0.2, 0.3: the median 0.2 s, 0.20x the reload, 0.2 / 4.7 of the step
    assert "| quickstart LoRA | adapter (auto on a GPU) | 6.00 | 10.0% | 0.20 | 0.20x | 4.3% | 4.50 |" in text
    assert "| quickstart LoRA | delta | 3.00 | 5.0% | 0.50 | 0.50x | 10.0% | 4.50 |" in text
    assert "| full fine-tune | delta | 30.00 | 15.0% | 4.00 | 2.00x | 40.0% | 6.00 |" in text
    assert "| full fine-tune | full reload | 200.00 | 100.0% | 2.00 | 1.00x | 25.0% | 6.00 |" in text
    assert f"Source: `benchmarks/results/{DELTA_SYNC}`." in text


def test_each_goal_says_who_meets_it_and_who_does_not():
    lines = {line.split(" (goal")[0]: line for line in delta_sync_table(_payload()).splitlines()
             if line.startswith("- ")}
    assert lines["- bytes per step as a share of a full sync"].endswith(
        "met by quickstart LoRA delta (5.0%), full fine-tune, lr 1e-06 delta (1.5%); not met by "
        "quickstart LoRA adapter (10.0%), full fine-tune delta (15.0%).")
    assert lines["- seconds per step against the full reload"].endswith(
        "met by quickstart LoRA delta (0.50x), quickstart LoRA adapter (0.20x), full fine-tune, "
        "lr 1e-06 delta (0.50x); not met by full fine-tune delta (2.00x).")
    assert lines["- sync seconds as a share of the step"].endswith(
        "met by quickstart LoRA delta (10.0%), quickstart LoRA adapter (4.3%); "
        "not met by full fine-tune delta (40.0%), full fine-tune, lr 1e-06 delta (14.3%).")


def test_sampling_through_the_adapter_is_set_against_the_merged_weights():
    text = delta_sync_table(_payload())
    assert "32 requests x 48 tokens" in text and "median of 3 runs" in text
    assert "| plain vLLM, merged weights | `smollm2` | 200.0 | 1.00x |" in text
    assert "| `--enable-lora` vLLM, the adapter | `smollm2` | 120.0 | 0.60x |" in text
    assert "| `--enable-lora` vLLM, the base (no adapter) | `smollm2-base` | 150.0 | 0.75x |" in text
    assert "adapter 6.00 MiB (fp32, as peft saves it) against 60.00 MiB" in text


def test_a_result_without_the_adapter_arm_renders_the_delta_alone():
    payload = _payload()
    for row in payload["policies"]["lora"]["rows"]:
        del row["adapter"]
    del payload["policies"]["lora"]["adapter"], payload["policies"]["lora"]["sampling"]
    text = delta_sync_table(payload)
    assert "adapter" not in text and "tokens/s" not in text
    assert "quickstart LoRA delta (5.0%)" in text


def test_a_policy_that_records_its_lr_names_it_and_every_policy_gives_its_changed_fraction():
    text = delta_sync_table(_payload())
    # full-rl: 2, 4, 3 MiB of 200: the median 3 MiB, 1.5%, and 1.5% of its elements changed
    assert "| full fine-tune, lr 1e-06 | delta | 3.00 | 1.5% | 1.00 | 0.50x | 14.3% | 6.00 |" in text
    assert "full fine-tune, lr 1e-06 delta (1.5%)" in text
    assert ("bf16 elements that changed per step (median), which a delta's size follows: "
            "quickstart LoRA 10.0%, full fine-tune 10.0%, full fine-tune, lr 1e-06 1.5%.") in text
