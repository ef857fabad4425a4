"""GRPO loss: PPO sign for every advantage, clipping, masking, KL, accumulation."""

import math

import pytest
import torch

from example_trainer.logprobs import token_logprobs
from example_trainer.loss import (
    clipped_policy_loss,
    grpo_loss,
    k3_kl,
    topk_distill_kl,
)


def _grad_wrt_logprob(logp: float, old: float, adv: float, eps: float = 0.2) -> float:
    lp = torch.tensor([[logp]], requires_grad=True)
    loss, _, _ = clipped_policy_loss(lp, torch.tensor([[old]]), torch.tensor([[adv]]), eps)
    loss.sum().backward()
    return lp.grad.item()


def test_positive_advantage_pushes_up_until_ratio_above_one_plus_eps():
    assert _grad_wrt_logprob(0.0, 0.0, 1.0) < 0  # descending the loss raises logp
    assert _grad_wrt_logprob(math.log(1.5), 0.0, 1.0) == 0.0  # r=1.5 > 1.2: clipped
    assert _grad_wrt_logprob(math.log(0.5), 0.0, 1.0) < 0  # r=0.5: still pushed up


def test_negative_advantage_uses_pessimistic_bound_not_upstream_inversion():
    # r > 1 + eps with A < 0: PPO keeps penalising (upstream stopped the gradient here).
    assert _grad_wrt_logprob(math.log(1.5), 0.0, -1.0) > 0
    # r < 1 - eps with A < 0: PPO stops (upstream kept pushing the token down).
    assert _grad_wrt_logprob(math.log(0.5), 0.0, -1.0) == 0.0
    assert _grad_wrt_logprob(0.0, 0.0, -1.0) > 0


def test_loss_value_is_min_of_surrogates():
    lp = torch.tensor([[math.log(1.5), math.log(0.5)]])
    loss, ratio, clipped = clipped_policy_loss(lp, torch.zeros(1, 2), torch.tensor([[-2.0, -2.0]]), 0.2)
    # A<0: -min(rA, clip(r)A) = -A*max(r, clip(r)) -> 2*1.5 and 2*0.8
    assert loss.tolist()[0] == pytest.approx([3.0, 1.6])
    assert clipped.tolist() == [[False, True]]
    assert ratio[0, 0].item() == pytest.approx(1.5)


def test_k3_kl_is_zero_at_equality_and_positive_elsewhere():
    lp = torch.tensor([[-1.0, -2.0, -0.5]])
    assert torch.allclose(k3_kl(lp, lp), torch.zeros_like(lp))
    kl = k3_kl(lp, torch.tensor([[-1.5, -1.0, -3.0]]))
    assert (kl > 0).all()
    # exact formula for one entry: exp(d) - d - 1 with d = ref - logp
    d = -1.5 - -1.0
    assert kl[0, 0].item() == pytest.approx(math.exp(d) - d - 1)


def test_token_logprobs_match_log_softmax_and_temperature():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7)
    labels = torch.tensor([[1, -100, 3], [0, 6, -100]])
    lp = token_logprobs(logits, labels, torch.tensor([1.0, 2.0]))
    ref0 = torch.log_softmax(logits[0, 0], -1)[1]
    ref1 = torch.log_softmax(logits[1, 1] / 2.0, -1)[6]
    assert lp[0, 0].item() == pytest.approx(ref0.item(), abs=1e-5)
    assert lp[1, 1].item() == pytest.approx(ref1.item(), abs=1e-5)
    assert lp[0, 1].item() == 0.0 and lp[1, 2].item() == 0.0


def test_token_logprobs_of_a_strided_view_match_log_softmax_with_gradients():
    # the trainer passes the logits tail (a view); values and gradients equal a plain gather
    torch.manual_seed(0)
    full = torch.randn(3, 6, 11, requires_grad=True)
    logits = full[:, 2:, :]
    assert not logits.is_contiguous()
    labels = torch.tensor([[1, -100, 3, 10], [0, 6, -100, 2], [-100, -100, 5, 4]])
    lp = token_logprobs(logits, labels)
    ref = torch.log_softmax(logits, -1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    ref = torch.where(labels == -100, torch.zeros_like(ref), ref)
    assert lp.shape == labels.shape
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=1e-5)
    (grad,) = torch.autograd.grad((lp * torch.arange(12.0).view(3, 4)).sum(), full)
    (ref_grad,) = torch.autograd.grad((ref * torch.arange(12.0).view(3, 4)).sum(), full)
    torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=1e-5)
    assert grad[:, :2].abs().sum() == 0 and grad[2, 2:4].abs().sum() == 0  # outside the view, ignored


def test_masked_positions_get_no_gradient_and_sequences_are_token_means():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 5, requires_grad=True)
    labels = torch.tensor([[-100, 2, 3, -100], [-100, -100, 4, -100]])
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4])
    out = grpo_loss(logits, labels, adv, None, num_sequences=2)
    out.loss.backward()
    assert logits.grad[0, 0].abs().sum() == 0 and logits.grad[0, 3].abs().sum() == 0
    assert logits.grad[1, :2].abs().sum() == 0
    assert logits.grad[0, 1].abs().sum() > 0
    # on-policy (no sampler logprobs): ratio 1, loss = -mean_i(A_i) = 0 here
    assert out.loss.item() == pytest.approx(0.0, abs=1e-6)
    assert out.metrics["tokens"] == 3
    assert out.metrics["ratio"] == pytest.approx(2.0)  # sum over 2 sequences of ratio 1


def test_gradient_accumulation_equals_full_batch():
    torch.manual_seed(1)
    logits = torch.randn(4, 3, 6)
    labels = torch.randint(0, 6, (4, 3))
    adv = torch.randn(4, 1).expand(4, 3).contiguous()
    old = torch.log_softmax(logits + 0.1 * torch.randn_like(logits), -1).gather(-1, labels[..., None])[..., 0]
    full_logits = logits.clone().requires_grad_(True)
    grpo_loss(full_logits, labels, adv, old, num_sequences=4).loss.backward()
    parts = logits.clone().requires_grad_(True)
    for sl in (slice(0, 1), slice(1, 4)):
        grpo_loss(parts[sl], labels[sl], adv[sl], old[sl], num_sequences=4).loss.backward()
    assert torch.allclose(full_logits.grad, parts.grad, atol=1e-6)


def test_nan_sampler_logprobs_fall_back_to_on_policy_ratio():
    logits = torch.zeros(1, 2, 4, requires_grad=True)
    labels = torch.tensor([[1, 2]])
    old = torch.tensor([[math.nan, math.log(0.25) - 1.0]])  # second token: ratio e^1 > 1.2
    out = grpo_loss(logits, labels, torch.ones(1, 2), old, num_sequences=1)
    out.loss.backward()
    assert logits.grad[0, 0].abs().sum() > 0  # nan -> ratio 1, gradient flows
    assert logits.grad[0, 1].abs().sum() == 0  # clipped for A > 0
    assert out.metrics["clip_fraction"] == pytest.approx(0.5)


def test_kl_term_pulls_towards_reference():
    logits = torch.zeros(1, 1, 3, requires_grad=True)
    labels = torch.tensor([[0]])
    ref = torch.tensor([[math.log(0.9)]])  # reference likes token 0 more than uniform
    out = grpo_loss(logits, labels, torch.zeros(1, 1), None, num_sequences=1, ref_logprobs=ref, kl_coef=1.0)
    assert out.metrics["kl"] > 0
    out.loss.backward()
    assert logits.grad[0, 0, 0] < 0  # descending raises token 0's logit toward the reference
    off = grpo_loss(logits, labels, torch.zeros(1, 1), None, num_sequences=1, ref_logprobs=ref, kl_coef=0.0)
    assert off.loss.item() == 0.0


def test_topk_distill_kl_matches_the_formula_and_skips_single_candidates():
    torch.manual_seed(0)
    logits = torch.randn(1, 3, 6)
    ids = torch.tensor([[[2, 4, 0], [5, 1, 0], [3, 0, 0]]])
    lps = torch.tensor([[[-0.2, -1.9, -math.inf], [-0.5, -1.0, -3.0], [-0.1, -math.inf, -math.inf]]])
    kd, known = topk_distill_kl(logits, ids, lps, temperature=torch.tensor([2.0]))
    assert known.tolist() == [[True, True, False]]  # one candidate: no teacher information
    log_pi = torch.log_softmax(logits / 2.0, dim=-1)
    for t, k in ((0, 2), (1, 3)):
        q = [math.exp(v) for v in lps[0, t, :k].tolist()]
        q = [v / sum(q) for v in q]
        expected = sum(qk * (math.log(qk) - log_pi[0, t, int(ids[0, t, j])].item())
                       for j, qk in enumerate(q))
        assert kd[0, t].item() == pytest.approx(expected, rel=1e-5)
    assert kd[0, 2].item() == 0.0


def test_distill_term_moves_the_student_to_the_teachers_candidates():
    logits = torch.zeros(1, 1, 4, requires_grad=True)
    ids = torch.tensor([[[1, 2]]])
    lps = torch.tensor([[[math.log(0.75), math.log(0.25)]]])  # renormalised: q = (0.75, 0.25)
    opt = torch.optim.SGD([logits], lr=1.0)
    first = None
    for _ in range(200):
        opt.zero_grad()
        out = grpo_loss(logits, torch.tensor([[1]]), torch.zeros(1, 1), None, num_sequences=1,
                        distill_token_ids=ids, distill_logprobs=lps, distill_coef=1.0)
        out.loss.backward()
        opt.step()
        first = out.metrics["distill_kl_sum"] if first is None else first
    probs = torch.softmax(logits.detach()[0, 0], dim=-1)
    assert out.metrics["distill_kl_sum"] < 0.1 * first and out.metrics["distill_tokens"] == 1
    assert probs[1] > probs[2] > probs[0]  # mass went to the candidates, 3:1 like the teacher
    assert (probs[1] / probs[2]).item() == pytest.approx(3.0, rel=0.05)
    off = grpo_loss(logits, torch.tensor([[1]]), torch.zeros(1, 1), None, num_sequences=1,
                    distill_token_ids=ids, distill_logprobs=lps, distill_coef=0.0)
    assert off.loss.item() == 0.0 and off.metrics["distill_tokens"] == 0


def test_bad_shapes_raise_clear_error():
    with pytest.raises(ValueError, match="shape mismatch"):
        grpo_loss(torch.zeros(1, 2, 3), torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3), None, num_sequences=1)
    with pytest.raises(ValueError, match="num_sequences"):
        grpo_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2), None, num_sequences=0)


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                      reason="needs a CUDA GPU (its block size is its own)"))


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_in_blocks_match_a_float32_log_softmax(monkeypatch, dtype, device):
    """Several blocks of rows, per-sequence temperatures, bf16 logits: the values and gradients of
    a float32 log-softmax of the whole tensor, the gradient in the logits' dtype, and the
    logits left as they were."""
    from example_trainer import logprobs

    monkeypatch.setitem(logprobs.LOGPROB_BLOCK_ELEMENTS, device, 3 * 13)  # 3 rows a block: 5 blocks
    torch.manual_seed(0)
    logits = (torch.randn(2, 7, 13) * 3).to(device=device, dtype=dtype).requires_grad_(True)
    before = logits.detach().clone()
    labels = torch.tensor([[1, -100, 3, 12, 0, -100, 5], [-100, 6, 2, 2, 11, 9, -100]], device=device)
    temperature = torch.tensor([0.7, 1.3], device=device)
    weights = torch.randn(2, 7).to(device)
    lp = token_logprobs(logits, labels, temperature)
    (grad,) = torch.autograd.grad((lp * weights).sum(), logits)

    ref_in = logits.detach().float().requires_grad_(True)
    ref = torch.log_softmax(ref_in / temperature.view(2, 1, 1), -1)
    ref = ref.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1).masked_fill(labels == -100, 0.0)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), ref_in)
    assert lp.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, ref_grad.to(dtype), atol=1e-6, rtol=1e-5 if dtype == torch.float32 else 1e-2)
    assert grad[0, 1].abs().sum() == 0 and grad[1, 6].abs().sum() == 0  # ignored rows
    assert torch.equal(logits.detach(), before)  # the backward computed its softmax in a copy


def test_loss_sums_stay_on_the_device_and_name_every_metric():
    """One ``[len(METRIC_NAMES)]`` tensor per micro-batch (nothing read back until asked), whose
    ``loss`` entry is the loss returned and whose token count is the trained tokens."""
    from example_trainer.loss import METRIC_NAMES, metric_dict

    torch.manual_seed(0)
    logits = torch.randn(2, 4, 11, requires_grad=True)
    labels = torch.tensor([[-100, 3, 4, -100], [-100, -100, 7, 1]])
    out = grpo_loss(logits, labels, torch.ones(2, 4), None, num_sequences=2)
    assert out.sums.shape == (len(METRIC_NAMES),) and out.sums.dtype == torch.float32
    assert not out.sums.requires_grad
    metrics = out.metrics
    assert list(metrics) == list(METRIC_NAMES)
    assert metrics["loss"] == pytest.approx(out.loss.item()) and metrics["tokens"] == 4.0
    assert metric_dict(out.sums + out.sums)["tokens"] == 8.0  # a step's total of two micro-batches
