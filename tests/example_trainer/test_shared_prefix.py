"""The shared-prefix forward is an optimisation only: same loss and gradients as the plain one."""

import pytest
import torch

from example_trainer.data import batch_to_sequences, make_micro_batches
from example_trainer.grpo import freeze_all_but_last_layers, policy_logits
from example_trainer.loss import grpo_loss
from example_trainer.shared_prefix import prefix_clusters


def _tiny_llama(layers=3):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=layers, num_attention_heads=2,
                                        num_key_value_heads=2, max_position_embeddings=128,
                                        attn_implementation="eager"))


def _group(prompt, replies, scores):
    """One GRPO group: every row is ``prompt + reply``, trained on the reply."""
    tokens = [prompt + r for r in replies]
    masks = [[-100] * len(prompt) + r for r in replies]
    lps = [[1.0] * len(prompt) + [-1.5 - 0.1 * k for k in range(len(r))] for r in replies]
    return {"tokens": tokens, "masks": masks, "scores": scores, "inference_logprobs": lps}


def _batch():
    # two groups (prompts of 7 and 11 tokens, replies of 2-6 tokens), a lone row with its own
    # prompt, and a multi-turn row whose mask has an untrained span between two trained ones
    g1 = _group([1, 2, 3, 4, 5, 6, 7], [[8, 9], [10, 11, 12, 13], [14, 15, 16], [17, 18, 19, 20, 21, 22]],
                [1.0, 0.0, 0.0, 1.0])
    g2 = _group(list(range(30, 41)), [[41, 42, 43], [44, 45], [46, 47, 48, 49, 50], [51, 52, 53]],
                [0.0, 1.0, 0.5, 0.25])
    lone = _group([3, 3, 3], [[5, 6, 7, 8]], [1.0])
    multi = {"tokens": [[9, 8, 7, 6, 5, 4, 3, 2, 1, 60, 61]],
             "masks": [[-100] * 4 + [5, 4] + [-100] * 3 + [60, 61]],
             "scores": [0.5], "inference_logprobs": [[1.0] * 4 + [-2.0, -2.0] + [1.0] * 3 + [-1.0, -1.0]]}
    return [g1, lone, g2, multi]


def _loss_and_grads(model, mbs, stats, num_tokens, shared, loss_type, autocast):
    model.zero_grad()
    total = 0.0
    for mb in mbs:
        keep, tail = mb.trained_tail()
        logits = policy_logits(model, tail, keep, autocast, shared_prefix=shared)
        out = grpo_loss(logits, tail.labels, tail.advantages, tail.sampler_logprobs,
                        num_sequences=stats.num_sequences, num_tokens=num_tokens,
                        temperature=tail.temperatures, loss_type=loss_type, dr_grpo_length=64)
        out.loss.backward()
        total += out.loss.item()
    return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("loss_type", ["grpo", "gspo", "dapo"])
@pytest.mark.parametrize("micro_batch_size", [10, 4])
def test_shared_prefix_matches_the_plain_forward(loss_type, micro_batch_size):
    model = _tiny_llama()
    freeze_all_but_last_layers(model, 2)  # as the quickstart: frozen bottom, trained top
    seqs, stats = batch_to_sequences(_batch())
    num_tokens = sum(sum(1 for label in s.labels if label != -100) for s in seqs)
    off = torch.autocast("cpu", enabled=False)
    plain = make_micro_batches(seqs, micro_batch_size, 0, 16)
    shared = make_micro_batches(seqs, micro_batch_size, 0, 16, by_prefix=True)
    plain_loss, plain_grads = _loss_and_grads(model, plain, stats, num_tokens, False, loss_type, off)
    shared_loss, shared_grads = _loss_and_grads(model, shared, stats, num_tokens, True, loss_type, off)
    assert plain_loss != 0.0
    assert shared_loss == pytest.approx(plain_loss, abs=1e-5)
    assert plain_grads.keys() == shared_grads.keys() and len(plain_grads) > 0
    for name, grad in plain_grads.items():
        assert torch.allclose(grad, shared_grads[name], atol=1e-5), name
    # the prompt's trainable layers get gradient through the repeated KV cache
    assert any("layers.1" in n and g.abs().sum() > 0 for n, g in shared_grads.items())


def test_shared_prefix_under_bf16_autocast_stays_close():
    model = _tiny_llama()
    seqs, stats = batch_to_sequences(_batch())
    bf16 = torch.autocast("cpu", dtype=torch.bfloat16)
    (mb,) = make_micro_batches(seqs, 10, 0, 16, by_prefix=True)
    keep, tail = mb.trained_tail()
    with torch.no_grad():
        plain = policy_logits(model, tail, keep, bf16)
        shared = policy_logits(model, tail, keep, bf16, shared_prefix=True)
    trained = tail.labels != -100
    assert (plain[trained] - shared[trained]).abs().max() < 0.05


def test_clusters_follow_the_untrained_prefix():
    seqs, _ = batch_to_sequences(_batch())
    (mb,) = make_micro_batches(seqs, 10, 0, 16, by_prefix=True)
    clusters = prefix_clusters(mb)
    # group 1 (4 rows, prompt 7 -> 6 shifted inputs), group 2 (4 rows), the lone row, the multi-turn row
    sizes = sorted((len(rows), p) for p, rows in clusters)
    assert sizes == [(1, 2), (1, 3), (4, 6), (4, 10)]
    assert sorted(b for _, rows in clusters for b in rows) == list(range(10))


def test_by_prefix_keeps_a_group_in_one_micro_batch():
    seqs, _ = batch_to_sequences(_batch())
    mbs = make_micro_batches(seqs, 4, 0, 16, by_prefix=True)
    assert [len(prefix_clusters(mb)) for mb in mbs] == [1, 1, 2]  # each group whole, then 2 lone rows
    # plain length order splits the groups over micro-batches
    assert sum(len(prefix_clusters(mb)) for mb in make_micro_batches(seqs, 4, 0, 16)) > 4


def test_shared_prefix_with_a_lora_adapter():
    from example_trainer import lora

    model = lora.apply_lora(_tiny_llama(), r=4, alpha=8, dropout=0.0,
                            target_modules=["q_proj", "v_proj"], last_layers=None)
    for p in model.parameters():  # a non-zero adapter, so its gradient path is exercised
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.1)
    seqs, stats = batch_to_sequences(_batch())
    num_tokens = sum(sum(1 for label in s.labels if label != -100) for s in seqs)
    off = torch.autocast("cpu", enabled=False)
    mbs = make_micro_batches(seqs, 10, 0, 16, by_prefix=True)
    plain_loss, plain_grads = _loss_and_grads(model, mbs, stats, num_tokens, False, "grpo", off)
    shared_loss, shared_grads = _loss_and_grads(model, mbs, stats, num_tokens, True, "grpo", off)
    assert shared_loss == pytest.approx(plain_loss, abs=1e-5)
    assert all(torch.allclose(g, shared_grads[n], atol=1e-5) for n, g in plain_grads.items())
