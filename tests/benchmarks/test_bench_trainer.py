"""The trainer benchmark's FLOP count matches the parameters of a real model's layer."""

from __future__ import annotations

import pytest

from tests.fixtures.bench_scripts import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_trainer.py")


@pytest.mark.parametrize("head_dim", [None, 48])  # 48 x 4 heads != hidden 128 (Qwen3-style)
def test_layer_matmul_params_counts_a_real_layers_weights(bench, head_dim):
    from transformers import LlamaConfig, LlamaForCausalLM

    extra = {} if head_dim is None else {"head_dim": head_dim}
    config = LlamaConfig(hidden_size=128, intermediate_size=320, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=64, **extra)
    layer = LlamaForCausalLM(config).model.layers[0]
    matmul_weights = sum(p.numel() for name, p in layer.named_parameters()
                         if name.endswith("proj.weight"))
    assert bench.attention_head_dim(config) == (head_dim or 32)
    assert bench.layer_matmul_params(config) == matmul_weights
