"""Activation checkpointing of the trained decoder layers: same gradients, less kept, matmuls not rerun."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")


def _tiny_llama(hidden_size=32, intermediate_size=64):
    """A 3-layer Llama (vocab 97, seed 0) with only its top 2 layers and final norm trained."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from example_trainer.policy import freeze_all_but_last_layers

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=hidden_size, intermediate_size=intermediate_size,
                         num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")
    model = LlamaForCausalLM(config).float()
    freeze_all_but_last_layers(model, 2)
    return model


class _CountOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the aten ops that reach the kernels (a cached, selectively saved op does not)."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _train_once(model):
    """One bf16-autocast forward and backward: logits, gradients, and the ops run in backward."""
    model.train()
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=ids, use_cache=False).logits.float()
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1))
    counter = _CountOps()
    with counter:
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logits.detach(), grads, counter.counts


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_checkpointing_gives_the_same_gradients(mode):
    from example_trainer.checkpointing import enable_checkpointing

    plain = _tiny_llama()
    checkpointed = copy.deepcopy(plain)
    enable_checkpointing(checkpointed, mode)
    logits, grads, _ = _train_once(plain)
    logits_c, grads_c, _ = _train_once(checkpointed)
    assert torch.equal(logits, logits_c)
    assert grads.keys() == grads_c.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads_c[name], grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_selective_recomputes_the_cheap_ops_but_not_the_matmuls():
    from example_trainer.checkpointing import enable_checkpointing

    plain = _tiny_llama()
    full, selective = copy.deepcopy(plain), copy.deepcopy(plain)
    enable_checkpointing(full, "full")
    enable_checkpointing(selective, "selective")
    counts = {name: _train_once(model)[2] for name, model in
              (("plain", plain), ("full", full), ("selective", selective))}
    # backward's own matmuls (gradients) run in all three; full also reruns the forward's
    assert counts["full"].get("mm", 0) > counts["plain"].get("mm", 0) > 0
    assert counts["selective"].get("mm", 0) == counts["plain"].get("mm", 0)
    assert counts["selective"].get("bmm", 0) == counts["plain"].get("bmm", 0)
    # ... while the norms' and activations' ops are rerun in backward (not kept from forward)
    for op in ("rsqrt", "silu"):
        assert counts["selective"].get(op, 0) > counts["plain"].get(op, 0), op
    # only the 2 trained layers are recomputed: backward never enters the frozen bottom layer
    # (Hugging Face's input-grad hook, which would make it, is removed)
    assert counts["full"]["silu"] == counts["selective"]["silu"] == 2


def test_lora_on_the_top_layers_checkpoints_without_backpropagating_through_the_frozen_ones():
    pytest.importorskip("peft")
    from example_trainer.checkpointing import enable_checkpointing
    from example_trainer.lora import apply_lora

    base = _tiny_llama()
    base.requires_grad_(False)
    plain = apply_lora(base, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"], last_layers=2)
    checkpointed = copy.deepcopy(plain)
    enable_checkpointing(checkpointed, "full")
    logits, grads, counts = _train_once(plain)
    logits_c, grads_c, counts_c = _train_once(checkpointed)
    assert torch.equal(logits, logits_c)
    assert grads.keys() == grads_c.keys() and grads and all("lora_" in name for name in grads)
    for name in grads:
        torch.testing.assert_close(grads_c[name], grads[name], rtol=1e-5, atol=1e-6, msg=name)
    # the adapted top 2 layers are rerun in backward; the frozen bottom layer is never entered
    assert counts.get("silu", 0) == 0 and counts_c["silu"] == 2


def test_the_policy_keeps_matmuls_and_recomputes_the_rest():
    from torch.utils.checkpoint import CheckpointPolicy

    from example_trainer.checkpointing import checkpoint_kwargs, keep_matmul_outputs

    aten = torch.ops.aten
    assert keep_matmul_outputs(None, aten.mm.default) == CheckpointPolicy.MUST_SAVE
    assert keep_matmul_outputs(None, aten.bmm.default) == CheckpointPolicy.MUST_SAVE
    assert keep_matmul_outputs(None, aten.silu.default) == CheckpointPolicy.PREFER_RECOMPUTE
    assert keep_matmul_outputs(None, aten._softmax.default) == CheckpointPolicy.PREFER_RECOMPUTE
    assert checkpoint_kwargs("full") == {"use_reentrant": False}
    assert checkpoint_kwargs("selective")["use_reentrant"] is False
    with pytest.raises(ValueError, match="not one of full, selective"):
        checkpoint_kwargs("some")


def test_the_trainer_config_turns_it_on(tmp_path):
    from example_trainer.config import TrainerConfig

    config = TrainerConfig(gradient_checkpointing=True, gradient_checkpointing_mode="selective")
    assert config.gradient_checkpointing_mode == "selective"
    with pytest.raises(ValueError):
        TrainerConfig(gradient_checkpointing_mode="layers")
