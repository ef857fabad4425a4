"""Which tensors a weight push carries: whole decoder blocks holding a trainable tensor."""

from __future__ import annotations

import pytest

from atroposlib.inference.weights.select import hf_name, layer_key, names_to_send


def test_names_to_send_are_whole_blocks_holding_a_trainable_tensor():
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
             "model.layers.1.mlp.up_proj.weight", "model.norm.weight", "lm_head.weight"]
    trainable = ["base_model.model.model.layers.1.self_attn.q_proj.lora_A.default.weight",
                 "model.norm.weight"]
    assert names_to_send(names, trainable) == names[2:6]
    assert hf_name(trainable[0]) == "model.layers.1.self_attn.q_proj.weight"
    assert layer_key("model.layers.12.mlp.up_proj.weight") == "model.layers.12"
    with pytest.raises(ValueError, match="no trainable parameter"):
        names_to_send(names, ["vision.tower.weight"])


def test_save_tensors_writes_a_tied_tensor_once(tmp_path):
    from safetensors.torch import load_file

    from atroposlib.inference.weights.select import save_tensors

    torch = pytest.importorskip("torch")
    shared = torch.ones(3)
    save_tensors({"a": shared, "b": shared, "c": torch.zeros(2)}, tmp_path / "w.safetensors")
    assert set(load_file(tmp_path / "w.safetensors")) == {"a", "c"}
