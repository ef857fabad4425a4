"""Batch -> padded, shifted tensors: advantages, overrides, placeholders, padding."""

import dataclasses
import math

import pytest
import torch

from example_trainer.data import (
    batch_to_sequences,
    group_advantages,
    make_micro_batches,
    padded_length,
    sequence_temperature,
)


def _group(scores, **extra):
    n = len(scores)
    tokens = [[10, 11, 12 + i, 13 + i] for i in range(n)]
    masks = [[-100, -100, 12 + i, 13 + i] for i in range(n)]
    lps = [[1.0, 1.0, -0.5, -0.25] for _ in range(n)]
    return {"tokens": tokens, "masks": masks, "scores": scores, "inference_logprobs": lps, **extra}


def test_group_advantages_standardise_with_population_std():
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0])
    assert group_advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]
    assert group_advantages([0.7]) == [0.7]  # singleton keeps its raw score
    assert sum(group_advantages([3.0, 1.0, 0.0])) == pytest.approx(0.0)


def test_shift_labels_logprobs_and_placeholders():
    seqs, stats = batch_to_sequences([_group([1.0, 0.0])])
    s = seqs[0]
    assert s.input_ids == [10, 11, 12]
    assert s.labels == [-100, 12, 13]
    assert math.isnan(s.sampler_logprobs[0]) and s.sampler_logprobs[1:] == [-0.5, -0.25]
    assert s.advantages == [1.0, 1.0, 1.0] and seqs[1].advantages == [-1.0] * 3
    assert stats.num_sequences == 2 and stats.has_inference_logprobs == 2 and stats.max_len == 4


def test_env_per_token_advantages_and_zero_override_win():
    g = _group([1.0, 0.0], advantages=[[0, 0, 0.3, 0.4], [0, 0, -0.1, -0.2]],
               overrides=[{}, {"set_advantage_to_zero": True}])
    seqs, _ = batch_to_sequences([g])
    assert seqs[0].advantages == pytest.approx([0.0, 0.3, 0.4])
    assert seqs[1].advantages == [0.0, 0.0, 0.0]


def test_temperature_precedence():
    g = _group([1.0, 0.0], overrides=[{"temperature": 0.5}, {}],
               generation_params={"temperature": 0.7}, group_overrides={"temperature": 0.9})
    assert sequence_temperature(g, 0) == 0.5
    assert sequence_temperature(g, 1) == 0.7
    assert sequence_temperature({"group_overrides": {"temperature": 0.9}}, 0) == 0.9
    assert sequence_temperature({}, 0) == 1.0
    assert sequence_temperature({"generation_params": {"temperature": 0}}, 0) == 1.0


def test_padding_to_multiple_and_micro_batches_cover_everything():
    long = {"tokens": [list(range(1, 41))], "masks": [[-100] * 20 + list(range(21, 41))], "scores": [1.0]}
    seqs, _ = batch_to_sequences([_group([1.0, 0.0, 0.5]), long])
    mbs = make_micro_batches(seqs, micro_batch_size=2, pad_token_id=0, pad_multiple=16)
    assert [mb.input_ids.shape[0] for mb in mbs] == [2, 2]
    assert mbs[0].input_ids.shape[1] == 16 and mbs[1].input_ids.shape[1] == 48
    last = mbs[1]
    row = int(torch.argmax(last.attention_mask.sum(1)))
    assert last.attention_mask[row].sum() == 39 and last.labels[row, 39:].eq(-100).all()
    assert torch.isnan(last.sampler_logprobs[row]).all()  # long group had no inference_logprobs
    assert sum(int((mb.labels != -100).sum()) for mb in mbs) == 3 * 2 + 20
    assert padded_length(65, 64) == 128 and padded_length(3, 64) == 64


def test_mismatched_rows_raise_with_field_names():
    bad = {"tokens": [[1, 2]], "masks": [[1, 2], [1]], "scores": [1.0]}
    with pytest.raises(ValueError, match="tokens/masks/scores"):
        batch_to_sequences([bad])
    with pytest.raises(ValueError, match="micro_batch_size"):
        make_micro_batches([], 0)


def test_teacher_arrays_are_shifted_like_labels_and_padded_to_the_widest_position():
    ids = [[[], [11, 5], [12, 6, 7], [13]], [[], [11], [14, 2], [15, 3]]]
    lps = [[[], [-0.1, -2.0], [-0.2, -1.0, -3.0], [-0.3]], [[], [-0.4], [-0.5, -0.6], [-0.7, -0.8]]]
    plain = _group([0.0, 1.0])
    seqs, _ = batch_to_sequences([_group([1.0, 0.0], distill_token_ids=ids, distill_logprobs=lps),
                                  plain])
    # target j (labels[j] = token j + 1) gets the teacher's position j + 1
    assert seqs[0].distill_token_ids == [[11, 5], [12, 6, 7], [13]]
    assert seqs[1].distill_logprobs == [[-0.4], [-0.5, -0.6], [-0.7, -0.8]]
    assert seqs[2].distill_token_ids is None
    [mb] = make_micro_batches(seqs, micro_batch_size=4, pad_multiple=8)
    assert mb.distill_token_ids.shape == (4, 8, 3) and mb.distill_logprobs.shape == (4, 8, 3)
    row = 0  # micro-batches sort by length (stable); all have length 3 here
    assert mb.distill_token_ids[row, 1].tolist() == [12, 6, 7]
    assert mb.distill_logprobs[row, 2].tolist()[1:] == [-math.inf, -math.inf]
    assert torch.isinf(mb.distill_logprobs[2:]).all()  # sequences without teacher arrays
    [mb_plain] = make_micro_batches(seqs[2:], micro_batch_size=4)
    assert mb_plain.distill_token_ids is None and mb_plain.distill_logprobs is None


def test_trained_tail_gives_the_same_loss_and_gradients_as_full_logits():
    """logits_to_keep on the tail is an optimisation only: loss and grads match the full forward."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from example_trainer.grpo import accepts_logits_to_keep
    from example_trainer.loss import grpo_loss

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=2, max_position_embeddings=64))
    assert accepts_logits_to_keep(model)
    # prompts of 5 and 9 tokens: the tail starts at the shorter one's first completion token
    groups = [{"tokens": [list(range(1, 13)), list(range(20, 36))],
               "masks": [[-100] * 5 + list(range(6, 13)), [-100] * 9 + list(range(29, 36))],
               "scores": [1.0, 0.0], "inference_logprobs": [[0.0] * 5 + [-3.0] * 7, [0.0] * 9 + [-4.0] * 7]}]
    seqs, stats = batch_to_sequences(groups)
    (mb,) = make_micro_batches(seqs, micro_batch_size=2, pad_token_id=0, pad_multiple=16)
    keep, tail = mb.trained_tail()
    assert keep == 16 - 4 and tail.labels.shape == (2, keep) and tail.input_ids.shape == (2, 16)
    assert int((tail.labels != -100).sum()) == int((mb.labels != -100).sum())

    def loss_and_grads(batch, **kw):
        model.zero_grad()
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **kw).logits
        out = grpo_loss(logits, batch.labels, batch.advantages, batch.sampler_logprobs,
                        num_sequences=stats.num_sequences, num_tokens=14, temperature=batch.temperatures)
        out.loss.backward()
        return out.loss.detach(), [p.grad.clone() for p in model.parameters()]

    full_loss, full_grads = loss_and_grads(mb)
    tail_loss, tail_grads = loss_and_grads(tail, logits_to_keep=keep)
    assert torch.allclose(full_loss, tail_loss, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(full_grads, tail_grads, strict=True))


def test_staged_cuts_the_tail_and_drops_only_all_ones_temperatures():
    """What a step does on the CPU before its first forward, shared by the trainer and its bench."""
    groups = [{"tokens": [list(range(1, 13)), list(range(20, 36))],
               "masks": [[-100] * 5 + list(range(6, 13)), [-100] * 9 + list(range(29, 36))],
               "scores": [1.0, 0.0], "inference_logprobs": [[0.0] * 5 + [-3.0] * 7, [0.0] * 9 + [-4.0] * 7]}]
    seqs, _ = batch_to_sequences(groups)
    (mb,) = make_micro_batches(seqs, micro_batch_size=2, pad_token_id=0, pad_multiple=16)
    assert mb.temperatures is not None and mb.temperatures.tolist() == [1.0, 1.0]

    keep, staged = mb.staged(torch.device("cpu"), tail=True)
    tail_keep, tail = mb.trained_tail()
    assert keep == tail_keep == 12 and staged.temperatures is None
    assert torch.equal(staged.labels, tail.labels) and torch.equal(staged.input_ids, mb.input_ids)

    keep, whole = mb.staged(torch.device("cpu"), tail=False)
    assert keep == 0 and torch.equal(whole.labels, mb.labels) and whole.temperatures is None

    # a temperature other than 1 is kept (a value <= 0 reads as 1 and is no reason to keep it)
    for temps, kept in (([0.7, 1.0], True), ([0.0, 1.0], False)):
        mixed = dataclasses.replace(mb, temperatures=torch.tensor(temps))
        _, out = mixed.staged(torch.device("cpu"), tail=True)
        assert (out.temperatures is not None) == kept
        if kept:
            assert out.temperatures.tolist() == pytest.approx(temps)
