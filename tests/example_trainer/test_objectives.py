"""Loss types (grpo, dr_grpo, dapo, gspo, cispo) and the sampler correction (tis, mis).

Each objective is pinned against numbers worked out by hand on one small batch:

    sequence 0: A = +1,   trained tokens p = (0.5, 0.25),      sampler p = (0.4, 0.25)
    sequence 1: A = -0.5, trained tokens p = (0.5, 0.8, 0.6),  sampler p = (0.5, 0.5, unknown)

so the ratios against the sampler are (1.25, 1) and (1, 1.6, 1). With a vocabulary of two the
label's probability is exactly ``p`` and ``dL/dlogp = dL/dlogit_label / (1 - p)``.
"""

import json
import math

import numpy as np
import pytest
import torch

from example_trainer.config import TrainerConfig
from example_trainer.data import batch_to_sequences, group_advantages
from example_trainer.loss import grpo_loss, objective_options
from tests.example_trainer import test_grpo_loop as loop

tiny_model = loop.tiny_model  # the loop tests' tiny random Llama fixture

NAN = math.nan
P = [[0.5, 0.25, 0.9], [0.5, 0.8, 0.6]]  # third token of sequence 0 is not trained
SAMPLER = [[0.4, 0.25, 0.9], [0.5, 0.5, NAN]]
LABELS = torch.tensor([[0, 0, -100], [0, 0, 0]])
ADV = torch.tensor([[1.0] * 3, [-0.5] * 3])


def _run(**kwargs):
    """Loss value and dL/dlogp of the canonical batch (``[2, 3]``, 0 where untrained)."""
    p = torch.tensor(P, dtype=torch.float64)
    logits = torch.stack([p.log(), (1 - p).log()], dim=-1).float().requires_grad_(True)
    old = torch.tensor([[math.log(v) if v == v else NAN for v in row] for row in SAMPLER])
    kwargs.setdefault("num_sequences", 2)
    out = grpo_loss(logits, LABELS, ADV, old, **kwargs)
    out.loss.backward()
    dlogp = (logits.grad[..., 0] / (1 - p.float())).numpy()
    return out, dlogp


def _check(out, dlogp, loss, grad):
    assert out.loss.item() == pytest.approx(loss, abs=1e-5)
    assert dlogp == pytest.approx(np.array(grad), abs=1e-5)


def test_grpo_token_mean_per_sequence_then_mean_over_sequences():
    out, g = _run(loss_type="grpo", clip_eps=0.2)
    # seq 0: r=1.25 > 1.2 with A>0 -> -1.2 (no grad); r=1 -> -1.  mean -1.1
    # seq 1: A<0: -min(rA, clip(r)A) = 0.5, 0.8 (r=1.6 unclipped), 0.5.  mean 0.6
    _check(out, g, (-1.1 + 0.6) / 2, [[0, -1 / 4, 0], [0.5 / 6, 0.8 / 6, 0.5 / 6]])
    assert out.metrics["clip_fraction"] == pytest.approx(0.5)  # half of sequence 0


def test_dr_grpo_divides_the_token_sum_by_a_constant():
    out, g = _run(loss_type="dr_grpo", clip_eps=0.2, dr_grpo_length=4)
    # same token losses as grpo, summed: -1.2 - 1 + 0.5 + 0.8 + 0.5 = -0.4, over L * N = 8
    _check(out, g, -0.4 / 8, [[0, -1 / 8, 0], [0.5 / 8, 0.8 / 8, 0.5 / 8]])


def test_dapo_token_mean_over_the_step_with_clip_higher():
    out, g = _run(loss_type="dapo", clip_eps_low=0.2, clip_eps_high=0.28, num_tokens=5)
    # r=1.25 < 1.28 is no longer clipped: -1.25; r=1.6 with A<0: -min(-0.8, -0.64) = 0.8
    total = -1.25 - 1 + 0.5 + 0.8 + 0.5
    _check(out, g, total / 5, [[-1.25 / 5, -1 / 5, 0], [0.5 / 5, 0.8 / 5, 0.5 / 5]])
    assert out.metrics["clip_fraction"] == 0.0


def test_gspo_one_length_normalised_ratio_per_sequence():
    s0 = math.sqrt(1.25)  # exp(mean(log 1.25, 0))
    s1 = 1.6 ** (1 / 3)  # exp(mean(0, log 1.6, 0)): the unknown sampler token has ratio 1
    out, g = _run(loss_type="gspo", clip_eps=0.2)
    # both within [0.8, 1.2]: loss_i = -s_i A_i, d/dlogp_t = -s_i A_i / |o_i| / N
    _check(out, g, (-s0 + 0.5 * s1) / 2,
           [[-s0 / 4, -s0 / 4, 0], [0.5 * s1 / 6, 0.5 * s1 / 6, 0.5 * s1 / 6]])
    assert out.metrics["ratio"] == pytest.approx(s0 + s1, abs=1e-5)
    # a tight range clips the whole of sequence 0 (A>0, s0 > 1.05) and none of sequence 1
    out, g = _run(loss_type="gspo", clip_eps_low=0.05, clip_eps_high=0.05)
    assert g[0].tolist() == [0.0, 0.0, 0.0]
    assert out.metrics["clip_fraction"] == pytest.approx(1.0)
    assert out.loss.item() == pytest.approx((-1.05 + 0.5 * s1) / 2, abs=1e-5)


def test_cispo_clipped_stop_gradient_weight_times_logprob():
    out, g = _run(loss_type="cispo", clip_eps=0.2, num_tokens=5)
    # weights: clip(1.25) = 1.2, 1, 1, clip(1.6) = 1.2, 1; loss_t = -w A logp
    w = [[1.2, 1.0], [1.0, 1.2, 1.0]]
    a = [1.0, -0.5]
    total = sum(-w[i][t] * a[i] * math.log(P[i][t]) for i in range(2) for t in range(len(w[i])))
    _check(out, g, total / 5, [[-1.2 / 5, -1 / 5, 0], [0.5 / 5, 0.6 / 5, 0.5 / 5]])
    # every token keeps a gradient, even the clipped ones (PPO would zero token (0, 0))
    assert (np.abs(g[LABELS.numpy() != -100]) > 0).all()


def test_tis_weights_each_token_by_the_truncated_trainer_over_sampler_ratio():
    out, g = _run(loss_type="grpo", is_correction="tis", is_cap=1.5)
    # PPO ratio is against the trainer's pi_old (= 1); w = min(pi_old / pi_sampler, 1.5)
    # seq 0: w = (1.25, 1) -> -1.25, -1 (mean -1.125); seq 1: w = (1, 1.5, 1) -> 0.5, 0.75, 0.5
    _check(out, g, (-1.125 + 1.75 / 3) / 2,
           [[-1.25 / 4, -1 / 4, 0], [0.5 / 6, 0.75 / 6, 0.5 / 6]])
    assert out.metrics["is_corrected_tokens"] == 1  # the 1.6
    assert out.metrics["sampler_out_of_range_tokens"] == 1
    assert out.metrics["sampler_tokens"] == 4  # sequence 1's last token has no sampler logprob
    expected_diff = abs(math.log(0.5 / 0.4)) + abs(math.log(0.8 / 0.5))
    assert out.metrics["sampler_logprob_diff_sum"] == pytest.approx(expected_diff, abs=1e-5)


def test_mis_weights_kept_tokens_by_the_ratio_and_drops_the_rest_but_keeps_them_in_the_denominator():
    out, g = _run(loss_type="grpo", is_correction="mis", is_cap=1.5)
    # w = rho inside [1/1.5, 1.5], else 0 (IcePop's token mask, arXiv:2510.18855)
    # seq 0: rho = (1.25, 1), both kept and weighted: -1.25, -1 (mean -1.125)
    # seq 1: rho = (1, 1.6, unknown -> 1): the 1.6 is dropped: (0.5 + 0 + 0.5) / 3
    _check(out, g, (-1.125 + 1 / 3) / 2, [[-1.25 / 4, -1 / 4, 0], [0.5 / 6, 0.0, 0.5 / 6]])
    assert out.metrics["is_corrected_tokens"] == 1


def test_mis_also_drops_ratios_below_one_over_cap():
    logits = torch.tensor([[[0.0, 0.0]]], requires_grad=True)  # p = 0.5
    old = torch.tensor([[math.log(0.9)]])  # pi_old / pi_sampler = 0.556 < 1/1.5
    out = grpo_loss(logits, torch.tensor([[0]]), torch.ones(1, 1), old, num_sequences=1,
                    is_correction="mis", is_cap=1.5)
    out.loss.backward()
    assert logits.grad.abs().sum() == 0 and out.metrics["is_corrected_tokens"] == 1
    tis = grpo_loss(logits, torch.tensor([[0]]), torch.ones(1, 1), old, num_sequences=1,
                    is_correction="tis", is_cap=1.5)
    assert tis.loss.item() == pytest.approx(-0.5 / 0.9, abs=1e-6)  # below the cap: kept as is
    assert tis.metrics["is_corrected_tokens"] == 0 and tis.metrics["sampler_out_of_range_tokens"] == 1


def test_default_arguments_are_todays_grpo():
    a, ga = _run()
    b, gb = _run(loss_type="grpo", clip_eps=0.2, clip_eps_low=0.2, clip_eps_high=0.2,
                 is_correction="none")
    assert a.loss.item() == b.loss.item() and (ga == gb).all()


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "gspo", "cispo"])
@pytest.mark.parametrize("is_correction", ["none", "tis", "mis"])
def test_step_loss_does_not_depend_on_the_micro_batching(loss_type, is_correction):
    torch.manual_seed(3)
    B, T, V = 5, 6, 7
    logits = torch.randn(B, T, V)
    labels = torch.randint(0, V, (B, T))
    labels[:, :2] = -100
    labels[0, 4:] = -100  # uneven lengths
    labels[3, 5] = -100
    adv = torch.randn(B, 1).expand(B, T).contiguous()
    noisy = torch.log_softmax(logits + 0.3 * torch.randn_like(logits), -1)
    old = noisy.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    old[1, 3] = NAN
    opts = dict(loss_type=loss_type, is_correction=is_correction, is_cap=1.3, clip_eps_low=0.1,
                clip_eps_high=0.15, num_sequences=B, num_tokens=int((labels != -100).sum()),
                dr_grpo_length=16)
    full = logits.clone().requires_grad_(True)
    whole = grpo_loss(full, labels, adv, old, **opts)
    whole.loss.backward()
    for splits in ([slice(0, 2), slice(2, 5)], [slice(0, 1), slice(1, 4), slice(4, 5)]):
        parts = logits.clone().requires_grad_(True)
        total = 0.0
        for sl in splits:
            out = grpo_loss(parts[sl], labels[sl], adv[sl], old[sl], **opts)
            out.loss.backward()
            total += out.loss.item()
        assert total == pytest.approx(whole.loss.item(), abs=1e-6)
        assert torch.allclose(full.grad, parts.grad, atol=1e-6)


def test_missing_step_counts_and_bad_names_raise_clear_errors():
    with pytest.raises(ValueError, match="num_tokens"):
        _run(loss_type="dapo")
    with pytest.raises(ValueError, match="dr_grpo_length"):
        _run(loss_type="dr_grpo")
    with pytest.raises(ValueError, match="loss_type"):
        _run(loss_type="ppo")
    with pytest.raises(ValueError, match="is_correction"):
        _run(is_correction="tiss")


def test_config_flags_and_scale_rewards():
    config = TrainerConfig(loss_type="dr_grpo", max_token_len=512)
    assert not config.scale_advantages
    assert objective_options(config)["dr_grpo_length"] == 512
    assert TrainerConfig().scale_advantages
    assert not TrainerConfig(scale_rewards="none").scale_advantages
    assert TrainerConfig(loss_type="dr_grpo", scale_rewards="group").scale_advantages
    options = objective_options(TrainerConfig(clip_eps_high=0.28, is_correction="tis"))
    assert options["clip_eps_high"] == 0.28 and options["clip_eps_low"] is None
    assert options["is_correction"] == "tis" and options["is_cap"] == 2.0
    with pytest.raises(ValueError, match="clip_eps_low"):
        TrainerConfig(clip_eps_low=1.5)
    assert TrainerConfig(loss_type="cispo", clip_eps_low=10.0).clip_eps_low == 10.0
    with pytest.raises(ValueError):
        TrainerConfig(is_cap=1.0)


def test_advantages_without_std_scaling():
    assert group_advantages([1.0, 0.0, 0.0, 1.0], scale=False) == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages([1.0, 0.0, 0.0, 1.0]) == [1.0, -1.0, -1.0, 1.0]  # std 0.5
    group = {"tokens": [[1, 2, 3], [1, 2, 4]], "masks": [[-100, 2, 3], [-100, 2, 4]],
             "scores": [3.0, 1.0]}
    seqs, _ = batch_to_sequences([group], scale_advantages=False)
    assert [s.advantages for s in seqs] == [[1.0, 1.0], [-1.0, -1.0]]
    seqs, _ = batch_to_sequences([group])
    assert [s.advantages for s in seqs] == [[1.0, 1.0], [-1.0, -1.0]]  # std 1: same here
    group["scores"] = [4.0, 0.0]
    assert batch_to_sequences([group], scale_advantages=False)[0][0].advantages == [2.0, 2.0]
    assert batch_to_sequences([group])[0][0].advantages == [1.0, 1.0]


@loop.needs_tokenizer
def test_loop_trains_with_dapo_and_tis_and_logs_the_mismatch(tiny_model, run_api, tmp_path):
    config = TrainerConfig(
        model=str(tiny_model), run_dir=str(tmp_path / "run"), api_url=run_api.url,
        vllm_url="http://127.0.0.1:9/v1", weight_sync="none", training_steps=1, batch_size=8,
        micro_batch_size=3, lr=1e-3, batch_timeout=60, loss_type="dapo", clip_eps_high=0.28,
        is_correction="tis", is_cap=2.0)
    result, _ = loop.train_on(config, run_api.url, [loop._group(seed) for seed in range(2)])
    assert result["steps"] == 1
    [step] = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
              if "loss" in json.loads(x)]
    # the env claims log-prob -0.5 per token; the random tiny model gives about log(1/49k), so
    # pi_old / pi_sampler << 1/C everywhere: out of range, but TIS only caps ratios above C
    assert step["sampler_logprob_diff"] > 5
    assert step["sampler_out_of_range"] == 1.0 and step["is_corrected_fraction"] == 0.0
    assert step["grad_norm"] > 0 and math.isfinite(step["loss"])
