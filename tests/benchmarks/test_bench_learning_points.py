"""bench_learning's accuracy points: what the trainer pushed is copied, adapters are merged to evaluate."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.benchmarks.conftest import load_benchmark


@pytest.fixture(scope="module")
def ours():
    return load_benchmark("learning.ours")


@pytest.fixture(scope="module")
def evaluate():
    return load_benchmark("learning.evaluate")


def _age(path: Path, seconds: float) -> None:
    """Set the mtime of ``path`` (every file in it, for a folder) to ``seconds`` ago."""
    stamp = time.time_ns() - int(seconds * 1e9)
    for file in [path] if path.is_file() else [p for p in path.iterdir() if p.is_file()]:
        os.utime(file, ns=(stamp, stamp))


def _push(run: Path, n: int, age: float, complete: bool = True) -> Path:
    """``vllm_weights/adapters/push_<n>`` as peft writes it (config last), written ``age`` s ago."""
    folder = run / "vllm_weights" / "adapters" / f"push_{n}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(f"adapter {n}".encode())
    if complete:
        (folder / "adapter_config.json").write_text(json.dumps({"push": n}))
    _age(folder, age)
    return folder


def _run_dir(tmp_path: Path, steps: int) -> Path:
    run = tmp_path / "run"
    (run / "vllm_weights").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, steps + 1)))
    return run


def test_the_newest_complete_adapter_push_is_copied_not_one_being_written(ours, tmp_path):
    run = _run_dir(tmp_path, steps=3)
    _push(run, 1, age=60)
    _push(run, 2, age=30)
    _push(run, 3, age=0, complete=False)  # the trainer is saving it right now
    dest = tmp_path / "point"
    assert ours.snapshot_sync_weights(run, dest) == (str(dest), 3)
    assert json.loads((dest / "adapter_config.json").read_text()) == {"push": 2}
    assert (dest / "adapter_model.safetensors").read_bytes() == b"adapter 2"
    assert json.loads((dest / "point.json").read_text()) == {
        "kind": "adapter", "source": "vllm_weights/adapters/push_2", "steps": 3}


def test_a_push_completed_under_a_second_ago_is_waited_for(ours, tmp_path):
    run = _run_dir(tmp_path, steps=4)
    _push(run, 3, age=60)
    _push(run, 4, age=0)  # complete, but written just now: it may still change
    dest = tmp_path / "point"
    begin = time.monotonic()
    assert ours.snapshot_sync_weights(run, dest) == (str(dest), 4)
    assert time.monotonic() - begin >= 0.7
    assert (dest / "adapter_model.safetensors").read_bytes() == b"adapter 4"
    assert json.loads((dest / "point.json").read_text())["source"] == "vllm_weights/adapters/push_4"


def test_pushed_weights_are_copied_when_the_trainer_reloads_them(ours, tmp_path):
    run = _run_dir(tmp_path, steps=2)
    weights = run / "vllm_weights" / "model.safetensors"
    weights.write_bytes(b"weights")
    _age(weights, 10)
    dest = tmp_path / "point"
    assert ours.snapshot_sync_weights(run, dest) == (str(dest), 2)
    assert (dest / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((dest / "point.json").read_text())["kind"] == "weights"


def test_before_the_first_step_the_starting_adapter_is_not_copied(ours, tmp_path):
    run = tmp_path / "run"
    _push(run, 0, age=60)  # the starting adapter vLLM serves; no metrics.jsonl yet
    assert ours.snapshot_sync_weights(run, tmp_path / "point") == (None, 0)
    assert ours.snapshot_sync_weights(tmp_path / "empty", tmp_path / "point") == (None, 0)


# --- evaluation: an adapter point is the base model with the adapter merged in ---------------

def _tiny_llama(out: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def _random_adapter(base_dir: Path, out: Path, r: int = 4, alpha: float = 8.0) -> dict:
    """Save a LoRA adapter with random A and B (non-zero update); return the merged weights expected.

    Expected: ``W + (alpha / r) * B @ A`` for every adapted linear layer, computed here by hand.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, init_lora_weights=False,
                                            target_modules=["q_proj", "v_proj", "down_proj"]))
    peft.save_pretrained(out)
    state = peft.state_dict()
    expected = {}
    for key, a in state.items():
        if ".lora_A.default.weight" in key:
            prefix = key.split(".lora_A.")[0]
            b = state[f"{prefix}.lora_B.default.weight"]
            name = prefix.removeprefix("base_model.model.") + ".weight"
            expected[name] = state[f"{prefix}.base_layer.weight"] + (alpha / r) * b @ a
    assert len(expected) == 6  # 3 modules x 2 layers
    return expected


def _logits(model, ids):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_an_adapter_point_evaluates_as_the_base_with_the_adapter_merged_in(evaluate, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    base_dir = _tiny_llama(tmp_path / "base")
    expected = _random_adapter(base_dir, tmp_path / "point")
    reference = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    base_logits = _logits(reference, list(range(10)))
    reference.load_state_dict(expected, strict=False)

    model, kind = evaluate.load_policy(base_dir, tmp_path / "point")
    assert kind == "adapter"
    assert not any("lora" in name for name, _ in model.named_parameters())  # merged, not wrapped
    assert all(p.dtype == torch.float32 for p in model.parameters())
    got = _logits(model, list(range(10)))
    torch.testing.assert_close(got, _logits(reference, list(range(10))), rtol=1e-5, atol=1e-5)
    assert (got - base_logits).abs().max() > 1e-2  # the adapter changed the policy


def test_a_lora_checkpoint_evaluates_its_adapter_not_its_saved_merge(evaluate, tmp_path):
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    base_dir = _tiny_llama(tmp_path / "base")
    final = tmp_path / "checkpoints" / "final"
    expected = _random_adapter(base_dir, final / "adapter")
    (final / "checkpoint.json").write_text(json.dumps({"step": 5, "lora": True}))
    # a merge saved at a lower precision: the evaluator must not use it when the adapter is there
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in expected.items()}, final / "model.safetensors")
    reference = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    reference.load_state_dict(expected, strict=False)

    model, kind = evaluate.load_policy(base_dir, final)
    assert kind == "checkpoint adapter"
    torch.testing.assert_close(_logits(model, [3, 1, 4, 1, 5]), _logits(reference, [3, 1, 4, 1, 5]),
                               rtol=1e-5, atol=1e-5)

    (final / "adapter" / "adapter_config.json").unlink()  # a full fine-tune's checkpoint: weights only
    model, kind = evaluate.load_policy(base_dir, final)
    assert kind == "checkpoint weights"
    assert torch.equal(model.state_dict()["model.layers.0.self_attn.q_proj.weight"],
                       expected["model.layers.0.self_attn.q_proj.weight"].to(torch.bfloat16).float())


def test_a_point_with_neither_adapter_nor_weights_is_refused(evaluate, tmp_path):
    base_dir = _tiny_llama(tmp_path / "base")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither an adapter"):
        evaluate.load_policy(base_dir, tmp_path / "empty")


@pytest.mark.slow  # ~1 min on a busy CPU: loads the bundled model twice and generates
def test_evaluate_all_scores_an_adapter_point_on_the_bundled_model(evaluate, bundled_model_dir, tmp_path):
    """The bench's own evaluator: a LoRA run's points say which policy each one scored."""
    _random_adapter_for(bundled_model_dir, tmp_path / "point")
    run = {"label": "ours-gspo-lora", "budget_minutes": 1.0,
           "points": {0.0: None, 0.5: str(tmp_path / "point"), 1.0: str(tmp_path / "point")}}
    assert evaluate.evaluate_all([run], difficulty=2, eval_batch=2, eval_size=2) == 2
    assert [(p["minute"], p["policy"]) for p in run["curve"]] == [
        (0.0, "base"), (0.5, "adapter"), (1.0, "adapter")]
    assert all(0.0 <= p["accuracy"] <= 1.0 for p in run["curve"])


def _random_adapter_for(base_dir: Path, out: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(2)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    get_peft_model(model, LoraConfig(r=2, lora_alpha=4, init_lora_weights=False, target_modules=["q_proj"],
                                     layers_to_transform=[29])).save_pretrained(out)
