"""Frozen Linears in bf16 (exact under bf16 autocast) and weight syncs of the trained tensors only."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")


def _tiny_llama(tied: bool = True):
    from transformers import LlamaConfig, LlamaForCausalLM

    from example_trainer.grpo import freeze_all_but_last_layers

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    model = LlamaForCausalLM(config).float()
    freeze_all_but_last_layers(model, 1)
    return model


def _loss_and_grads(model):
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=ids).logits.float()
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 97), ids[:, 1:].reshape(-1))
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_frozen_linears_in_bf16_give_the_same_logits_and_gradients_under_autocast():
    from example_trainer.memory import compact_frozen_linears

    model = _tiny_llama()
    compacted = copy.deepcopy(model)
    freed = compact_frozen_linears(compacted, torch.bfloat16)
    frozen_linears = [m for m in compacted.modules()
                      if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad
                      and m is not compacted.lm_head]
    # every frozen Linear but the LM head (tied to the embeddings) is bf16; trained ones stay fp32
    assert freed == sum(m.weight.numel() * 2 for m in frozen_linears) > 0
    assert all(m.weight.dtype == torch.bfloat16 for m in frozen_linears)
    assert compacted.lm_head.weight.dtype == torch.float32
    assert compacted.lm_head.weight is compacted.model.embed_tokens.weight
    assert all(p.dtype == torch.float32 for p in compacted.parameters() if p.requires_grad)
    logits, grads = _loss_and_grads(model)
    logits_c, grads_c = _loss_and_grads(compacted)
    assert torch.equal(logits, logits_c)
    assert grads.keys() == grads_c.keys() and all(torch.equal(grads[n], grads_c[n]) for n in grads)


def test_without_autocast_the_compacted_model_differs():
    """The saving is exact only under autocast: a plain fp32 forward sees rounded weights."""
    from example_trainer.memory import compact_frozen_linears

    model = _tiny_llama(tied=False)
    compacted = copy.deepcopy(model)
    compact_frozen_linears(compacted, torch.bfloat16)
    assert compacted.lm_head.weight.dtype == torch.bfloat16  # untied: an ordinary frozen Linear
    ids = torch.randint(0, 97, (2, 7))
    with pytest.raises(RuntimeError):  # fp32 activations meet a bf16 weight
        compacted(input_ids=ids)


def test_sync_tensors_copies_only_what_it_must():
    from example_trainer.memory import sync_tensors, trained_names

    model = _tiny_llama()
    state = model.state_dict()
    trained = trained_names(model)
    assert trained and all(n.startswith(("model.layers.3.", "model.norm.")) for n in trained)

    only = sync_tensors(state, trained, only_trained=True, dtype_name=None, snapshot=False)
    assert set(only) == trained
    assert all(only[n].data_ptr() == state[n].data_ptr() for n in only)  # views, no copy

    snap = sync_tensors(state, trained, only_trained=False, dtype_name=None, snapshot=True)
    assert set(snap) == set(state)
    for name, tensor in snap.items():  # trained ones copied for the background writer
        assert (tensor.data_ptr() != state[name].data_ptr()) == (name in trained)
        assert torch.equal(tensor, state[name])

    half = sync_tensors(state, trained, only_trained=False, dtype_name="bfloat16", snapshot=True)
    assert all(t.dtype == torch.bfloat16 for t in half.values())
    assert half["lm_head.weight"] is half["model.embed_tokens.weight"]  # the tie stays shared


def test_the_trainer_sizes_its_vllm_from_its_batches(bundled_model_dir):
    from example_trainer.config import TrainerConfig
    from example_trainer.vllm_sync import vllm_sizing

    base = dict(model=str(bundled_model_dir), batch_size=16, max_token_len=256,
                vllm_max_model_len=512, vllm_dtype="bfloat16")
    sizing = vllm_sizing(TrainerConfig(**base))
    assert sizing.max_num_seqs == 64 and sizing.kv_cache_bytes == (64 * 8 + 1) * 32 * 23_040
    coarse = vllm_sizing(TrainerConfig(**base, vllm_extra_args=["--block-size", "128"]))
    assert coarse.kv_cache_bytes == (64 * 2 + 1) * 128 * 23_040
    fixed = vllm_sizing(TrainerConfig(**base, vllm_max_num_seqs=8, vllm_kv_cache_gib=1.5))
    assert (fixed.max_num_seqs, fixed.kv_cache_bytes) == (8, int(1.5 * 2**30))


def test_temperature_one_adds_no_logits_copy_and_changes_nothing():
    """softmax(logits / 1) is softmax(logits): the division (a [B, T, V] copy and its
    gradient) is skipped, with identical log-probs and gradients."""
    from example_trainer.logprobs import scaled_logits, token_logprobs

    logits = torch.randn(2, 3, 11, requires_grad=True)
    labels = torch.tensor([[1, 2, -100], [4, 5, 6]])
    ones = torch.tensor([1.0, 0.0])  # <= 0 counts as 1
    assert scaled_logits(logits, ones) is logits
    a = token_logprobs(logits, labels, ones)
    (ga,) = torch.autograd.grad(a.sum(), logits)
    b = token_logprobs(logits, labels, None)
    (gb,) = torch.autograd.grad(b.sum(), logits)
    assert torch.equal(a, b) and torch.equal(ga, gb)
    hot = scaled_logits(logits, torch.tensor([0.5, 1.0]))
    assert torch.allclose(hot[0], logits[0] * 2) and torch.equal(hot[1], logits[1])


def test_a_frozen_tied_embedding_in_bf16_rounds_only_the_lookups():
    """The tied LM head computes exactly what autocast computed from the fp32 table; the
    lookups return fp32 values rounded to bf16, and the table takes half the memory."""
    from example_trainer.memory import compact_frozen_linears, round_frozen_embeddings

    model = _tiny_llama()
    rounded = copy.deepcopy(model)
    table = rounded.model.embed_tokens.weight
    freed = round_frozen_embeddings(rounded, torch.bfloat16)
    compact_frozen_linears(rounded, torch.bfloat16)
    assert freed == table.numel() * 2
    assert rounded.model.embed_tokens.weight.dtype == torch.bfloat16
    assert rounded.lm_head.weight is rounded.model.embed_tokens.weight  # still tied
    # the reference: the same model with its fp32 table holding the rounded values
    reference = copy.deepcopy(model)
    with torch.no_grad():
        reference.model.embed_tokens.weight.copy_(table.to(torch.bfloat16).float())
    ids = torch.tensor([[1, 5, 96, 7]])
    assert rounded.model.embed_tokens(ids).dtype == torch.float32
    assert torch.equal(rounded.model.embed_tokens(ids), reference.model.embed_tokens(ids))
    logits, grads = _loss_and_grads(reference)
    logits_r, grads_r = _loss_and_grads(rounded)
    assert torch.equal(logits, logits_r)
    assert grads.keys() == grads_r.keys() and all(torch.equal(grads[n], grads_r[n]) for n in grads)
    # and the rounding is real: the fp32 model's lookups differ
    assert not torch.equal(model.model.embed_tokens(ids), rounded.model.embed_tokens(ids))


def test_a_trained_embedding_is_left_alone():
    from example_trainer.memory import round_frozen_embeddings

    model = _tiny_llama()
    model.model.embed_tokens.weight.requires_grad_(True)
    assert round_frozen_embeddings(model, torch.bfloat16) == 0
    assert model.model.embed_tokens.weight.dtype == torch.float32


def test_lora_base_linears_go_to_bf16_with_the_same_logits_and_adapter_gradients():
    """With LoRA every base Linear is frozen, the adapted ones' too: stored in bf16 they
    compute bit for bit what autocast computed from fp32, and the adapter trains as before."""
    pytest.importorskip("peft")
    from transformers import LlamaConfig, LlamaForCausalLM

    from example_trainer.lora import apply_lora
    from example_trainer.memory import compact_frozen_linears

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = apply_lora(LlamaForCausalLM(config).float(), r=4, alpha=8, dropout=0.0,
                       target_modules=["q_proj", "v_proj", "down_proj"], last_layers=2)
    with torch.no_grad():  # B starts at zero: make the adapter's path count
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.1)
    compacted = copy.deepcopy(model)
    freed = compact_frozen_linears(compacted, torch.bfloat16)
    adapted = [m.base_layer for m in compacted.modules() if hasattr(m, "base_layer")]
    assert len(adapted) == 6 and all(m.weight.dtype == torch.bfloat16 for m in adapted)
    assert freed > sum(m.weight.numel() * 2 for m in adapted)  # the plain frozen Linears too
    assert all(p.dtype == torch.float32 for p in compacted.parameters() if p.requires_grad)
    logits, grads = _loss_and_grads(model)
    logits_c, grads_c = _loss_and_grads(compacted)
    assert grads and all("lora_" in n for n in grads)
    assert torch.equal(logits, logits_c)
    assert grads.keys() == grads_c.keys() and all(torch.equal(grads[n], grads_c[n]) for n in grads)
