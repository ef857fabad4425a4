"""GRPO loss: per-token clipped policy-gradient objective with an optional k3 KL penalty.

The objective is GRPO's (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, eq. 3) with the
PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, eq. 7) applied per token::

    r_t      = exp(logp_t - old_logp_t)                      importance ratio vs the sampler
    pg_t     = -min(r_t * A_t, clip(r_t, 1 - eps, 1 + eps) * A_t)     (for EVERY sign of A_t)
    kl_t     = exp(ref_t - logp_t) - (ref_t - logp_t) - 1    k3 estimator (Schulman 2020,
                                                             http://joschu.net/blog/kl-approx.html)
    kd_t     = sum_k q_k (log q_k - log pi(c_k))                 optional teacher distillation
    loss_i   = sum_t mask_t * (pg_t + beta * kl_t + gamma * kd_t) / sum_t mask_t
                                                                     token mean per sequence
    loss     = sum_i loss_i / num_sequences_in_step                  sequence mean over the step

``kd_t`` is only used when the batch carries teacher arrays (``TeacherDistillationEnv``) and
``gamma = distill_coef > 0``: see :func:`topk_distill_kl`.

``old_logp`` is the sampler's (vLLM's) log-prob of the token, so the ratio also corrects the
small trainer/sampler mismatch; without sampler log-probs the ratio is 1 and the objective is
plain on-policy REINFORCE with group-normalised advantages.

Upstream Atropos used ``-max(rA, clip(r)A)`` for negative advantages, which keeps pushing a
token down after its ratio fell below ``1 - eps`` and stops penalising it once the ratio rose
above ``1 + eps``: the opposite of PPO's pessimistic bound. This module uses ``min`` for every
sign; ``tests/example_trainer/test_loss.py`` pins the difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported lazily so `atropos-grpo --help` stays fast
    import torch


@dataclass
class LossOutput:
    """Result of :func:`grpo_loss` for one micro-batch.

    Attributes:
        loss: scalar tensor to call ``backward()`` on (already divided by ``num_sequences``).
        metrics: detached float sums over the micro-batch's sequences (divide by the step's
            sequence count for means) or maxima; keys listed in :func:`grpo_loss`.
    """

    loss: torch.Tensor
    metrics: dict[str, float]


def scaled_logits(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """``logits / temperature`` in float32, per sequence.

    Args:
        logits: ``[B, T, V]``.
        temperature: ``[B]``, ``[B, 1]`` or ``[B, 1, 1]``; values <= 0 are treated as 1. None: 1.

    Returns:
        ``[B, T, V]`` float32 logits (the input itself when it is already float32 and
        ``temperature`` is None).
    """
    import torch

    logits = logits.float()
    if temperature is None:
        return logits
    temp = temperature.reshape(-1, 1, 1).to(logits)
    return logits / torch.where(temp > 0, temp, torch.ones_like(temp))


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probability of each label token under ``softmax(logits / temperature)``.

    Args:
        logits: ``[B, T, V]`` next-token logits (position t predicts ``labels[:, t]``).
        labels: ``[B, T]`` token ids; ``-100`` marks positions to ignore (their log-prob is 0).
        temperature: ``[B]``, ``[B, 1]`` or ``[B, 1, 1]`` sampling temperature per sequence;
            values <= 0 are treated as 1. None means 1.

    Returns:
        ``[B, T]`` float32 log-probs (0 at ignored positions).
    """
    import torch.nn.functional as F

    logits = scaled_logits(logits, temperature)
    # cross_entropy never materialises a second [B, T, V] log-softmax tensor for the gather.
    nll = F.cross_entropy(
        logits.transpose(1, 2), labels.clamp(min=-100), ignore_index=-100, reduction="none"
    )
    return -nll


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate per token, pessimistic for every sign of the advantage.

    ``loss_t = -min(r_t A_t, clip(r_t, 1-eps, 1+eps) A_t)`` with ``r_t = exp(logp_t - old_t)``
    (Schulman et al. 2017, arXiv:1707.06347, eq. 7). For ``A < 0`` this equals
    ``-A * max(r, clip(r))``: the gradient stops once ``r < 1 - eps`` (the token was already
    pushed down enough) and keeps penalising while ``r > 1 + eps``.

    Args:
        logprobs: ``[B, T]`` current-policy log-probs (with grad).
        old_logprobs: ``[B, T]`` sampler log-probs (no grad).
        advantages: ``[B, T]`` (or broadcastable, e.g. ``[B, 1]``) advantages.
        clip_eps: the clip range ``eps`` (> 0), e.g. 0.2.

    Returns:
        ``(loss [B, T], ratio [B, T], clipped [B, T] bool)`` where ``clipped`` marks tokens whose
        gradient is zero because the clipped branch was selected.
    """
    import torch

    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    unclipped_obj = ratio * advantages
    clipped_obj = clipped_ratio * advantages
    loss = -torch.minimum(unclipped_obj, clipped_obj)
    clipped = clipped_obj < unclipped_obj
    return loss, ratio, clipped


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference), always >= 0.

    ``kl_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1`` (Schulman 2020, "Approximating KL
    divergence"; used by GRPO, arXiv:2402.03300 eq. 4).

    Args:
        logprobs: ``[B, T]`` current-policy log-probs of the sampled tokens.
        ref_logprobs: ``[B, T]`` reference-policy log-probs of the same tokens.

    Returns:
        ``[B, T]`` non-negative per-token KL estimates.
    """
    delta = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return delta.exp() - delta - 1.0


def topk_distill_kl(
    logits: torch.Tensor,
    teacher_ids: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    temperature: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token forward KL from the teacher's top-K candidates to the student policy.

    ``q_k = softmax_k(teacher_logprobs)`` renormalises the teacher over its ``K`` candidates
    ``c_k`` and ``kd_t = sum_k q_k (log q_k - log pi(c_k))``, with ``log pi`` the student's full-
    vocabulary log-softmax (at the sampling temperature). This is word-level knowledge
    distillation (Hinton et al. 2015, arXiv:1503.02531; Kim & Rush 2016, arXiv:1606.07947)
    applied to the student's own rollouts, i.e. on-policy distillation with the forward KL
    (GKD, Agarwal et al. 2024, arXiv:2306.13649), truncated to the teacher's top K. The gradient
    pulls the student's mass toward the teacher's candidates in proportion to ``q``.

    Args:
        logits: ``[B, T, V]`` student logits (position t predicts target t).
        teacher_ids: ``[B, T, K]`` candidate ids per target (any value where padded).
        teacher_logprobs: ``[B, T, K]`` teacher log-probs, ``-inf`` where padded.
        temperature: ``[B]``-like sampling temperatures (the student logits are divided by
            them), or None.

    Returns:
        ``(kd [B, T], known [B, T] bool)``: ``kd`` is 0 where ``known`` is False, i.e. where the
        teacher gave fewer than 2 candidates (one renormalised candidate carries no teacher
        information: with ``teacher_top_k 0`` only the sampled token's log-prob is sent).
    """
    import torch

    logits = scaled_logits(logits, temperature)
    teacher = teacher_logprobs.to(logits)
    known = torch.isfinite(teacher).sum(dim=-1) >= 2
    # padded candidates get q = 0; rows with no finite entry get a harmless finite stand-in
    safe_teacher = torch.where(known.unsqueeze(-1), teacher, torch.zeros_like(teacher))
    log_q = torch.log_softmax(safe_teacher, dim=-1)
    q = log_q.exp()
    log_pi = logits.gather(-1, teacher_ids.clamp(min=0)) - torch.logsumexp(logits, dim=-1, keepdim=True)
    terms = torch.where(q > 0, q * (log_q - log_pi), torch.zeros_like(q))
    kd = torch.where(known, terms.sum(dim=-1), torch.zeros_like(terms[..., 0]))
    return kd, known


def grpo_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    advantages: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    *,
    num_sequences: int,
    clip_eps: float = 0.2,
    temperature: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    distill_token_ids: torch.Tensor | None = None,
    distill_logprobs: torch.Tensor | None = None,
    distill_coef: float = 0.0,
) -> LossOutput:
    """GRPO loss of one micro-batch (formula in the module docstring).

    Args:
        logits: ``[B, T, V]`` model output for the padded inputs.
        labels: ``[B, T]`` target ids, ``-100`` where not trained (prompt, padding).
        advantages: ``[B, T]`` per-token advantages (a sequence's scalar advantage repeated).
        old_logprobs: ``[B, T]`` sampler log-probs of ``labels``; ``nan`` where unknown (the
            ratio is then 1 for that token). None: unknown everywhere (on-policy REINFORCE).
        num_sequences: sequences in the whole optimiser step (all micro-batches); the sum of
            per-sequence losses is divided by it, so gradient accumulation gives the exact mean.
        clip_eps: PPO clip range.
        temperature: ``[B]``-like sampling temperatures (the logits are divided by them).
        ref_logprobs: ``[B, T]`` reference log-probs for the KL penalty (``nan`` where unknown:
            no KL there), or None.
        kl_coef: KL coefficient ``beta`` (0 disables the KL term).
        distill_token_ids: ``[B, T, K]`` teacher candidate ids, or None.
        distill_logprobs: ``[B, T, K]`` teacher log-probs (``-inf`` where padded), or None.
        distill_coef: distillation coefficient ``gamma`` (0 disables the term); see
            :func:`topk_distill_kl`.

    Returns:
        :class:`LossOutput`; ``metrics`` has sums over sequences of ``pg_loss``, ``kl``,
        ``ratio``, ``clip_fraction``, ``logprob`` (mean trained-token log-prob),
        ``sampler_logprob_diff`` (mean |logp - old_logp|) and ``tokens`` (trained tokens), plus
        ``distill_kl_sum`` / ``distill_tokens`` (teacher KL summed over the trained tokens that
        had teacher candidates, and their count).

    Raises:
        ValueError: shapes disagree, or ``num_sequences`` < 1.
    """
    import torch

    if num_sequences < 1:
        raise ValueError(f"num_sequences must be >= 1, got {num_sequences}")
    if logits.shape[:2] != labels.shape or advantages.shape != labels.shape:
        raise ValueError(
            f"shape mismatch: logits {tuple(logits.shape)}, labels {tuple(labels.shape)}, "
            f"advantages {tuple(advantages.shape)}; expected [B, T, V], [B, T], [B, T]"
        )
    mask = (labels != -100).float()
    logits = scaled_logits(logits, temperature)  # once, for the policy and the distill terms
    logprobs = token_logprobs(logits, labels)
    detached = logprobs.detach()
    if old_logprobs is None:
        old = detached
        known = torch.zeros_like(mask)
    else:
        known = torch.isfinite(old_logprobs).float() * mask
        old = torch.where(known.bool(), old_logprobs.to(detached), detached)
    pg, ratio, clipped = clipped_policy_loss(logprobs, old, advantages.to(logprobs), clip_eps)
    per_token = pg
    kl = torch.zeros_like(logprobs)
    if ref_logprobs is not None and kl_coef != 0.0:
        # Where the reference log-prob is unknown (nan) the KL term is 0.
        ref = torch.where(torch.isfinite(ref_logprobs), ref_logprobs.to(detached), detached)
        kl = k3_kl(logprobs, ref)
        per_token = per_token + kl_coef * kl
    kd = torch.zeros_like(logprobs)
    kd_known = torch.zeros_like(mask)
    if distill_coef != 0.0 and distill_token_ids is not None and distill_logprobs is not None:
        kd, known = topk_distill_kl(logits, distill_token_ids, distill_logprobs)
        kd_known = known.float() * mask
        per_token = per_token + distill_coef * kd
    tokens = mask.sum(dim=1)
    denom = tokens.clamp(min=1.0)

    def seq_mean(x: torch.Tensor) -> torch.Tensor:
        return (x * mask).sum(dim=1) / denom

    loss = seq_mean(per_token).sum() / num_sequences
    with torch.no_grad():
        known_count = known.sum()
        metrics = {
            "pg_loss": seq_mean(pg.detach()).sum().item(),
            "kl": seq_mean(kl.detach()).sum().item(),
            "ratio": seq_mean(ratio.detach()).sum().item(),
            "clip_fraction": seq_mean(clipped.float()).sum().item(),
            "logprob": seq_mean(detached).sum().item(),
            "tokens": tokens.sum().item(),
            "sampler_logprob_diff_sum": ((detached - old).abs() * known).sum().item(),
            "sampler_tokens": known_count.item(),
            "distill_kl_sum": (kd.detach() * kd_known).sum().item(),
            "distill_tokens": kd_known.sum().item(),
        }
    return LossOutput(loss=loss, metrics=metrics)
