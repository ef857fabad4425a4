"""Policy-gradient losses of the example trainer: GRPO and its variants, KL, distillation.

Every loss type shares the per-token pieces below and differs in the policy term and in how the
token losses of a step are averaged. Notation: ``i`` a sequence, ``t`` one of its trained tokens
(``|o_i|`` of them), ``N`` sequences and ``M = sum_i |o_i|`` trained tokens in the whole
optimiser step (over every micro-batch), ``A_it`` the advantage::

    r_t      = exp(logp_t - old_t)                               importance ratio
    ppo_t    = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)   (for EVERY sign of A_t)
    kl_t     = exp(ref_t - logp_t) - (ref_t - logp_t) - 1        k3 estimator (Schulman 2020,
                                                                 http://joschu.net/blog/kl-approx.html)
    kd_t     = sum_k q_k (log q_k - log pi(c_k))                 optional teacher distillation
    l_t      = w_t * pg_t + beta * kl_t + gamma * kd_t           w_t: sampler correction (below)

Per loss type, the policy term and the step loss::

    grpo      pg_t = ppo_t                                  loss = 1/N sum_i 1/|o_i| sum_t l_t
    dr_grpo   pg_t = ppo_t                                  loss = 1/(N L) sum_i sum_t l_t
    dapo      pg_t = ppo_t                                  loss = 1/M sum_i sum_t l_t
    gspo      pg_t = ppo_t with r_t := s_i (per sequence)   loss = 1/N sum_i 1/|o_i| sum_t l_t
    cispo     pg_t = -sg(clip(r_t, 1-eps_low, 1+eps_high)) A_t logp_t
                                                            loss = 1/M sum_i sum_t l_t

- ``grpo`` (default): Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, eq. 3, with the PPO
  clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, eq. 7) per token.
- ``dr_grpo``: Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783, the Dr. GRPO objective:
  no ``1/|o_i|`` (it biases toward long wrong answers) and no std scaling of advantages (the
  trainer's ``--scale-rewards auto`` turns it off for this loss type). ``L`` is a constant
  (``--dr-grpo-length``, default ``--max-token-len``), as in TRL's ``loss_type="dr_grpo"``
  which divides by ``max_completion_length`` times the batch.
- ``dapo``: Yu et al. 2025, arXiv:2503.14476, the DAPO objective: token-level mean over the step and
  the decoupled clip ``--clip-eps-low`` / ``--clip-eps-high`` ("clip-higher", e.g. 0.2 / 0.28).
- ``gspo``: Zheng et al. 2025, arXiv:2507.18071, the GSPO objective: ``s_i = exp(1/|o_i| sum_t (logp_t -
  old_t))``, clipped per sequence (the paper uses tiny ranges, e.g. 3e-4 / 4e-4); see
  :func:`gspo_policy_loss`.
- ``cispo``: MiniMax-M1 (Chen et al. 2025), arXiv:2506.13585, the CISPO objective: clipped, stop-gradient
  importance weight times the log-prob, so no token's gradient is dropped.

The asymmetric clip applies to every type (both ranges default to ``--clip-eps``). ``grpo``,
``gspo`` and ``dr_grpo`` divide by ``N`` or a constant and ``dapo``/``cispo`` by the step's ``M``,
so the step's loss and gradient do not depend on how it is split into micro-batches.

**Which ratio.** Each batch gets exactly one optimiser step, and every micro-batch's forward runs
before it, so the trainer's pre-update log-prob ``pi_old`` equals the current ``logp`` in value.
``old_t`` is therefore:

- with ``--is-correction none`` (default): the sampler's (vLLM's) log-prob, the env's
  ``inference_logprobs``. ``r_t = pi_theta / pi_sampler`` is then purely the sampler/trainer
  mismatch, and the clip bounds it. Where the env sent none the ratio is 1 (plain on-policy
  REINFORCE with group-normalised advantages) and ``w_t = 1``;
- with ``--is-correction tis|mis``: the trainer's ``pi_old``, so ``r_t = 1`` in value (gradient
  ``grad logp_t``), and the mismatch ``pi_old / pi_sampler`` goes into the weight ``w_t`` instead
  (truncated or masked importance sampling: :func:`sampler_correction`).

``kd_t`` is only used when the batch carries teacher arrays (``TeacherDistillationEnv``) and
``gamma = distill_coef > 0``: see :func:`topk_distill_kl`.

Upstream Atropos used ``-max(rA, clip(r)A)`` for negative advantages, which keeps pushing a
token down after its ratio fell below ``1 - eps`` and stops penalising it once the ratio rose
above ``1 + eps``: the opposite of PPO's pessimistic bound. This module uses ``min`` for every
sign; ``tests/example_trainer/test_loss.py`` pins the difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from example_trainer.logprobs import scaled_logits, token_logprobs

if TYPE_CHECKING:  # torch is imported lazily so `atropos-grpo --help` stays fast
    import torch

LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "gspo", "cispo")
"""Accepted ``loss_type`` values (TRL's names)."""
IS_CORRECTIONS = ("none", "tis", "mis")
"""Accepted ``is_correction`` values."""


#: Names of :attr:`LossOutput.sums`, in order (their meaning: :func:`grpo_loss`).
METRIC_NAMES = (
    "loss", "pg_loss", "kl", "ratio", "clip_fraction", "logprob", "tokens", "sampler_logprob_diff_sum",
    "sampler_tokens", "is_corrected_tokens", "sampler_out_of_range_tokens", "distill_kl_sum",
    "distill_tokens",
)


@dataclass
class LossOutput:
    """Result of :func:`grpo_loss` for one micro-batch.

    Attributes:
        loss: scalar tensor to call ``backward()`` on (already divided by ``num_sequences``).
        sums: detached float32 ``[len(METRIC_NAMES)]`` tensor on the loss's device: sums over
            the micro-batch's sequences or tokens, named by :data:`METRIC_NAMES`. It stays on
            the device so that a step can add up its micro-batches and read them back once:
            each read (``.item()``, ``.tolist()``) waits for the GPU to finish all queued work.
    """

    loss: torch.Tensor
    sums: torch.Tensor

    @property
    def metrics(self) -> dict[str, float]:
        """:attr:`sums` as ``{name: float}`` (one read back from the device)."""
        return metric_dict(self.sums)


def metric_dict(sums: torch.Tensor) -> dict[str, float]:
    """``{name: float}`` from a ``[len(METRIC_NAMES)]`` tensor of :class:`LossOutput` sums (or their total)."""
    return dict(zip(METRIC_NAMES, sums.tolist(), strict=True))


def ppo_clip(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic clipped surrogate for a given ratio, with an asymmetric clip range.

    ``loss = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`` (Schulman et al. 2017,
    arXiv:1707.06347, eq. 7; the decoupled ``eps_low`` / ``eps_high`` "clip-higher" of DAPO, Yu et
    al. 2025, arXiv:2503.14476).

    Args:
        ratio: ``[B, T]`` importance ratio (with grad).
        advantages: ``[B, T]`` or broadcastable advantages.
        clip_eps_low: lower clip range (``r`` is clipped at ``1 - eps_low``).
        clip_eps_high: upper clip range (``r`` is clipped at ``1 + eps_high``).

    Returns:
        ``(loss [B, T], clipped [B, T] bool)``; ``clipped`` marks entries whose gradient is zero
        because the clipped branch was selected.
    """
    import torch

    clipped_ratio = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)
    unclipped_obj = ratio * advantages
    clipped_obj = clipped_ratio * advantages
    return -torch.minimum(unclipped_obj, clipped_obj), clipped_obj < unclipped_obj


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float,
    clip_eps_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate per token, pessimistic for every sign of the advantage.

    ``loss_t = -min(r_t A_t, clip(r_t, 1-eps, 1+eps_high) A_t)`` with ``r_t = exp(logp_t - old_t)``
    (Schulman et al. 2017, arXiv:1707.06347, eq. 7). For ``A < 0`` this equals
    ``-A * max(r, clip(r))``: the gradient stops once ``r < 1 - eps`` (the token was already
    pushed down enough) and keeps penalising while ``r > 1 + eps_high``.

    Args:
        logprobs: ``[B, T]`` current-policy log-probs (with grad).
        old_logprobs: ``[B, T]`` log-probs of the policy that the ratio is taken against (no grad).
        advantages: ``[B, T]`` (or broadcastable, e.g. ``[B, 1]``) advantages.
        clip_eps: the (lower) clip range ``eps`` (> 0), e.g. 0.2.
        clip_eps_high: the upper clip range; None: ``clip_eps`` (symmetric).

    Returns:
        ``(loss [B, T], ratio [B, T], clipped [B, T] bool)`` where ``clipped`` marks tokens whose
        gradient is zero because the clipped branch was selected.
    """
    import torch

    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))
    high = clip_eps if clip_eps_high is None else clip_eps_high
    loss, clipped = ppo_clip(ratio, advantages, clip_eps, high)
    return loss, ratio, clipped


def gspo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO: one length-normalised importance ratio per sequence, clipped per sequence.

    ``s_i = exp(mean_t (logp_it - old_it))`` over the sequence's trained tokens (Zheng et al.
    2025, "Group Sequence Policy Optimization", arXiv:2507.18071), used in the token form
    of the paper's GSPO-token variant: ``s_it = sg(s_i) * pi(y_t) / sg(pi(y_t))``, so every
    token carries the value ``s_i`` (and is clipped together with its sequence) while the gradient
    reaches each token's log-prob; with one advantage per sequence the objective and its gradient
    equal plain GSPO's ``-min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i)``.

    Args:
        logprobs: ``[B, T]`` current-policy log-probs (with grad).
        old_logprobs: ``[B, T]`` log-probs the ratio is taken against (no grad).
        advantages: ``[B, T]`` advantages.
        mask: ``[B, T]`` float, 1 on trained tokens.
        clip_eps_low: lower clip range of ``s_i``.
        clip_eps_high: upper clip range of ``s_i``.

    Returns:
        ``(loss [B, T], ratio [B, T], clipped [B, T] bool)``: ``ratio`` is ``s_i`` broadcast over
        the sequence's tokens, ``clipped`` is the same for every token of a sequence.
    """
    import torch

    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0) * mask
    seq_log_ratio = log_ratio.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    detached = logprobs.detach()
    ratio = torch.exp(seq_log_ratio.detach() + logprobs - detached)
    loss, clipped = ppo_clip(ratio, advantages, clip_eps_low, clip_eps_high)
    return loss, ratio, clipped


def cispo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CISPO: clip the importance weight, not the update, and stop its gradient.

    ``loss_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_t * logp_t`` with
    ``r_t = exp(logp_t - old_t)`` (MiniMax-M1, Chen et al. 2025, arXiv:2506.13585, the CISPO objective). Unlike
    PPO, no token loses its gradient: a token far off the ratio range still gets
    ``-A * (1 +- eps)`` times its log-prob gradient. The paper sets no lower bound in practice
    (a large ``eps_low``) and tunes only ``eps_high``.

    Args:
        logprobs: ``[B, T]`` current-policy log-probs (with grad).
        old_logprobs: ``[B, T]`` log-probs the ratio is taken against (no grad).
        advantages: ``[B, T]`` advantages.
        clip_eps_low: the weight is clipped below at ``1 - eps_low`` (``>= 1``: no lower bound).
        clip_eps_high: the weight is clipped above at ``1 + eps_high``.

    Returns:
        ``(loss [B, T], ratio [B, T], clipped [B, T] bool)``: ``clipped`` marks tokens whose weight
        was clipped.
    """
    import torch

    ratio = torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0)).detach()
    weight = ratio.clamp(max(1.0 - clip_eps_low, 0.0), 1.0 + clip_eps_high)
    return -weight * advantages * logprobs, ratio, weight != ratio


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


def sampler_correction(
    trainer_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    known: torch.Tensor,
    mode: str,
    cap: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token importance weight correcting for the sampler/trainer mismatch.

    vLLM's log-probs differ from the trainer's even for the same weights (kernels, precision,
    batch-dependent reductions), so the rollouts are slightly off-policy. With
    ``rho_t = pi_old(y_t) / pi_sampler(y_t)`` (``pi_old``: the trainer's probability under the
    weights before this step's update; ``pi_sampler``: the env's ``inference_logprobs``):

    - ``tis`` (truncated importance sampling; Yao et al. 2025, "Your Efficient RL Framework
      Secretly Brings You Off-Policy RL Training", https://fengyao.notion.site/off-policy-rl):
      ``w_t = min(rho_t, C)``; TRL calls it ``vllm_importance_sampling_correction`` with
      ``vllm_importance_sampling_cap``, verl "rollout correction" (token-level IS);
    - ``mis`` (token-level masked importance sampling): ``w_t = rho_t`` if ``1/C <= rho_t <= C``
      else 0: a token whose mismatch is within the range is weighted by its importance ratio,
      as in ``tis``, and one outside it is dropped from the gradient instead of capped. This is
      IcePop's token-level discrepancy mask (Ling Team 2025, "Every Step Evolves: Scaling
      Reinforcement Learning for Trillion-Scale Thinking Model", arXiv:2510.18855: the ratio
      ``pi_train / pi_infer`` multiplies the policy-gradient term inside the band ``[alpha,
      beta]``, here ``[1/C, C]``, and zeroes it outside) and the token-level "MIS" estimator of
      Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
      Training-Inference Mismatch" (https://richardli.xyz/rl-collapse: ``rho * 1[rho in
      range]``). TRL's ``vllm_importance_sampling_mode="token_mask"`` is the same with an upper
      bound only. The dropped token still counts in the loss denominators, so the step's loss
      does not depend on the micro-batching;
    - ``none``: ``w_t = 1``.

    Tokens without a sampler log-prob get ``w_t = 1``.

    Args:
        trainer_logprobs: ``[B, T]`` trainer log-probs (``pi_old``; no grad).
        sampler_logprobs: ``[B, T]`` sampler log-probs (any value where not ``known``).
        known: ``[B, T]`` bool, trained tokens that have a sampler log-prob.
        mode: ``"none"``, ``"tis"`` or ``"mis"``.
        cap: ``C`` (> 1).

    Returns:
        ``(weight [B, T] float, corrected [B, T] bool, out_of_range [B, T] bool)``:
        ``corrected`` marks tokens whose weight was capped (tis) or that were dropped (mis);
        ``out_of_range`` marks known tokens with ``rho_t`` outside ``[1/C, C]`` (logged for every
        mode, as a mismatch diagnostic).

    Raises:
        ValueError: unknown ``mode`` or ``cap <= 1``.
    """
    import torch

    if mode not in IS_CORRECTIONS:
        raise ValueError(f"is_correction must be one of {IS_CORRECTIONS}, got {mode!r}")
    if cap <= 1.0:
        raise ValueError(f"is_cap must be > 1, got {cap}")
    log_rho = torch.where(known, trainer_logprobs - sampler_logprobs, torch.zeros_like(trainer_logprobs))
    rho = torch.exp(log_rho.clamp(-20.0, 20.0))
    out_of_range = known & ((rho > cap) | (rho < 1.0 / cap))
    if mode == "tis":
        return rho.clamp(max=cap), known & (rho > cap), out_of_range
    if mode == "mis":
        return torch.where(out_of_range, torch.zeros_like(rho), rho), out_of_range, out_of_range
    return torch.ones_like(rho), torch.zeros_like(known), out_of_range


def objective_options(config: Any) -> dict[str, Any]:
    """The :func:`grpo_loss` keyword arguments set by a ``TrainerConfig`` (duck-typed).

    Args:
        config: an object with ``loss_type``, ``clip_eps``, ``clip_eps_low``, ``clip_eps_high``,
            ``dr_grpo_length``, ``max_token_len``, ``is_correction`` and ``is_cap``.

    Returns:
        A dict for ``grpo_loss(..., **objective_options(config))``.
    """
    return {
        "loss_type": config.loss_type,
        "clip_eps": config.clip_eps,
        "clip_eps_low": config.clip_eps_low,
        "clip_eps_high": config.clip_eps_high,
        "dr_grpo_length": config.dr_grpo_length or config.max_token_len,
        "is_correction": config.is_correction,
        "is_cap": config.is_cap,
    }


def grpo_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    advantages: torch.Tensor,
    sampler_logprobs: torch.Tensor | None,
    *,
    num_sequences: int,
    clip_eps: float = 0.2,
    temperature: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    distill_token_ids: torch.Tensor | None = None,
    distill_logprobs: torch.Tensor | None = None,
    distill_coef: float = 0.0,
    loss_type: str = "grpo",
    clip_eps_low: float | None = None,
    clip_eps_high: float | None = None,
    num_tokens: float | None = None,
    dr_grpo_length: int | None = None,
    is_correction: str = "none",
    is_cap: float = 2.0,
) -> LossOutput:
    """Policy loss of one micro-batch (formulas in the module docstring).

    Args:
        logits: ``[B, T, V]`` model output for the padded inputs.
        labels: ``[B, T]`` target ids, ``-100`` where not trained (prompt, padding).
        advantages: ``[B, T]`` per-token advantages (a sequence's scalar advantage repeated).
        sampler_logprobs: ``[B, T]`` sampler (behaviour policy) log-probs of ``labels``, the
            wire's ``inference_logprobs``; ``nan`` where unknown (the ratio is then 1 for that
            token). None: unknown everywhere (on-policy REINFORCE).
        num_sequences: sequences in the whole optimiser step (all micro-batches); the sum of
            per-sequence losses is divided by it, so gradient accumulation gives the exact mean.
        clip_eps: PPO clip range (both sides unless ``clip_eps_low`` / ``clip_eps_high`` given).
        temperature: ``[B]``-like sampling temperatures (the logits are divided by them).
        ref_logprobs: ``[B, T]`` reference log-probs for the KL penalty (``nan`` where unknown:
            no KL there), or None.
        kl_coef: KL coefficient ``beta`` (0 disables the KL term).
        distill_token_ids: ``[B, T, K]`` teacher candidate ids, or None.
        distill_logprobs: ``[B, T, K]`` teacher log-probs (``-inf`` where padded), or None.
        distill_coef: distillation coefficient ``gamma`` (0 disables the term); see
            :func:`topk_distill_kl`.
        loss_type: one of :data:`LOSS_TYPES`.
        clip_eps_low: lower clip range (ratio clipped at ``1 - eps_low``); None: ``clip_eps``.
        clip_eps_high: upper clip range (ratio clipped at ``1 + eps_high``); None: ``clip_eps``.
        num_tokens: trained tokens in the whole optimiser step (needed by the token-level
            ``dapo`` and ``cispo``, which divide the step's summed token loss by it).
        dr_grpo_length: the constant ``L`` of ``dr_grpo`` (needed by it).
        is_correction: ``"none"``, ``"tis"`` or ``"mis"``; see :func:`sampler_correction`.
        is_cap: ``C`` of the correction (> 1).

    Returns:
        :class:`LossOutput`; its ``sums`` (``metrics`` as a dict) hold ``loss`` (the returned
        loss's value), sums over sequences of ``pg_loss``, ``kl``,
        ``ratio``, ``clip_fraction``, ``logprob`` (per-sequence token means), plus token sums:
        ``tokens`` (trained tokens), ``sampler_logprob_diff_sum`` / ``sampler_tokens`` (summed
        ``|logp - sampler_logp|`` over the trained tokens that have a sampler log-prob, and their
        count), ``is_corrected_tokens`` (capped or dropped by the correction),
        ``sampler_out_of_range_tokens`` (``pi_old / pi_sampler`` outside ``[1/C, C]``),
        ``distill_kl_sum`` / ``distill_tokens``.

    Raises:
        ValueError: shapes disagree, ``num_sequences`` < 1, an unknown ``loss_type`` or
            ``is_correction``, or ``num_tokens`` / ``dr_grpo_length`` missing for a loss type
            that needs it.
    """
    import torch

    if num_sequences < 1:
        raise ValueError(f"num_sequences must be >= 1, got {num_sequences}")
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if loss_type in ("dapo", "cispo") and not num_tokens:
        raise ValueError(f"loss_type {loss_type!r} needs num_tokens (trained tokens in the whole "
                         "step, over all micro-batches)")
    if loss_type == "dr_grpo" and not dr_grpo_length:
        raise ValueError("loss_type 'dr_grpo' needs dr_grpo_length (the constant L, e.g. the "
                         "longest allowed sequence)")
    if logits.shape[:2] != labels.shape or advantages.shape != labels.shape:
        raise ValueError(
            f"shape mismatch: logits {tuple(logits.shape)}, labels {tuple(labels.shape)}, "
            f"advantages {tuple(advantages.shape)}; expected [B, T, V], [B, T], [B, T]"
        )
    eps_low = clip_eps if clip_eps_low is None else clip_eps_low
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    mask = (labels != -100).float()
    logprobs = token_logprobs(logits, labels, temperature)
    detached = logprobs.detach()
    if sampler_logprobs is None:
        sampler = detached
        known = torch.zeros_like(mask, dtype=torch.bool)
    else:
        known = torch.isfinite(sampler_logprobs) & mask.bool()
        sampler = torch.where(known, sampler_logprobs.to(detached), detached)
    is_weight, corrected, out_of_range = sampler_correction(detached, sampler, known, is_correction, is_cap)
    # The ratio's denominator: the sampler (today's default) or, with a correction, the trainer's
    # own pre-update log-probs, which equal `detached` since every batch gets one optimiser step.
    old = sampler if is_correction == "none" else detached
    adv = advantages.to(logprobs)
    if loss_type == "gspo":
        pg, ratio, clipped = gspo_policy_loss(logprobs, old, adv, mask, eps_low, eps_high)
    elif loss_type == "cispo":
        pg, ratio, clipped = cispo_policy_loss(logprobs, old, adv, eps_low, eps_high)
    else:
        pg, ratio, clipped = clipped_policy_loss(logprobs, old, adv, eps_low, eps_high)
    pg = pg * is_weight
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
        kd, kd_ok = topk_distill_kl(logits, distill_token_ids, distill_logprobs, temperature)
        kd_known = kd_ok.float() * mask
        per_token = per_token + distill_coef * kd
    tokens = mask.sum(dim=1)
    denom = tokens.clamp(min=1.0)

    def seq_mean(x: torch.Tensor) -> torch.Tensor:
        return (x * mask).sum(dim=1) / denom

    if loss_type in ("grpo", "gspo"):
        loss = seq_mean(per_token).sum() / num_sequences
    elif loss_type == "dr_grpo":
        loss = (per_token * mask).sum() / (float(dr_grpo_length) * num_sequences)
    else:  # dapo, cispo: token mean over the whole step
        loss = (per_token * mask).sum() / float(num_tokens)
    with torch.no_grad():  # one stacked tensor: nothing here waits for the device
        knownf = known.float()
        sums = torch.stack([
            loss.detach().float(),
            seq_mean(pg.detach()).sum(),
            seq_mean(kl.detach()).sum(),
            seq_mean(ratio.detach()).sum(),
            seq_mean(clipped.float()).sum(),
            seq_mean(detached).sum(),
            tokens.sum(),
            ((detached - sampler).abs() * knownf).sum(),
            knownf.sum(),
            corrected.float().sum(),
            out_of_range.float().sum(),
            (kd.detach() * kd_known).sum(),
            kd_known.sum(),
        ]).float()
    return LossOutput(loss=loss, sums=sums)
