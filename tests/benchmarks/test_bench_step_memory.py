"""The step-memory benchmark runs the trainer's real step per setting and splits its live memory."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.fixtures.bench_scripts import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_step_memory.py")


def test_settings_parse_as_yaml_values_and_a_bad_one_says_how_to_write_it(bench):
    assert bench.parse_settings("micro_batch_size=8, loss_type=gspo;micro_batch_size=4") == [
        {"micro_batch_size": 8, "loss_type": "gspo"}, {"micro_batch_size": 4}]
    with pytest.raises(ValueError, match="key=value"):
        bench.parse_settings("micro_batch_size")


def _tiny_launch_config(tmp_path):
    """A 2-layer Llama, a word-level tokenizer of its 256 ids and a launch config: nothing from the Hub."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(256)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="t0", pad_token="t1",
                            eos_token="t2").save_pretrained(tmp_path / "model")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                 max_position_embeddings=64)).save_pretrained(tmp_path / "model")
    config = tmp_path / "launch.yaml"
    config.write_text(yaml.safe_dump({"trainer": {
        "model": str(tmp_path / "model"), "batch_size": 4, "micro_batch_size": 4,
        "train_last_layers": 1, "torch_threads": 1, "weight_sync": "reload", "eval_interval": 5}}))
    return config


def test_each_setting_gets_its_steps_and_the_profile_finds_gradients_and_activations(bench, tmp_path):
    config = _tiny_launch_config(tmp_path)
    result = bench.main(["--config", str(config), "--settings", "micro_batch_size=4;micro_batch_size=2",
                         "--steps", "2", "--warmup", "0", "--groups", "1", "--group-size", "4",
                         "--prompt-len", "6", "--max-completion", "5", "--profile",
                         "--json-out", str(tmp_path / "out.json")])

    rows = result["rows"]
    assert [r["setting"] for r in rows] == [{"micro_batch_size": 4}, {"micro_batch_size": 2}]
    for row in rows:
        assert len(row["seconds"]) == 2 and all(s > 0 for s in row["seconds"])
        assert row["resting_rss_mib"] > 0
        live = row["live_at_peak_mib"]
        # the trained layer's gradients and the saved activations exist only inside the step
        assert live["parameter"] > 0 and live["max"]["gradient"] > 0 and live["max"]["activation"] > 0
        assert live["total"] > live["total_before_step"]
    assert rows[0]["seconds_ratio"] == 1.0
    written = json.loads((tmp_path / "out.json").read_text())
    # the result file records the benchmark's own command, not the test runner's
    assert written["meta"]["command"].startswith("python benchmarks/bench_step_memory.py --config ")
    assert written["meta"]["benchmark"] == "bench_step_memory" and written["rows"] == json.loads(json.dumps(rows))


def test_checkpointing_is_switched_per_setting_and_keeps_fewer_activations(bench, tmp_path):
    config = _tiny_launch_config(tmp_path)
    result = bench.main(["--config", str(config), "--settings",
                         "micro_batch_size=4;micro_batch_size=4,gradient_checkpointing=true,"
                         "gradient_checkpointing_mode=selective;micro_batch_size=4",
                         "--steps", "1", "--warmup", "0", "--groups", "1", "--group-size", "4",
                         "--prompt-len", "6", "--max-completion", "5", "--profile",
                         "--json-out", str(tmp_path / "out.json")])
    plain, selective, plain_again = (row["live_at_peak_mib"]["max"]["activation"] for row in result["rows"])
    # the shared policy checkpoints only for the setting that asks for it, and back off after it
    assert selective < plain
    assert plain_again == pytest.approx(plain, rel=0.05)
