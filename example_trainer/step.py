"""One GRPO step on one batch: micro-batches, loss and backward, the optimizer step, the step's metrics.

:class:`StepRunner` holds what every step reuses (the policy, the optional frozen reference
for the KL term, the forward's settings) so that :func:`example_trainer.grpo.train` reads as
the loop alone. Loss: :func:`example_trainer.loss.grpo_loss` (GRPO, Shao et al. 2024,
arXiv:2402.03300, and the variants ``--loss-type`` names).
"""

from __future__ import annotations

import time
from typing import Any

from atroposlib.type_definitions import IGNORE_INDEX
from example_trainer.policy import Policy, accepts_logits_to_keep, load_policy, policy_logits


class StepRunner:
    """Trains the policy on one batch per :meth:`run` call."""

    def __init__(self, config: Any, dist: Any, policy: Policy, device: Any):
        """Decide the forward's settings once.

        Args:
            config: the :class:`~example_trainer.config.TrainerConfig`.
            dist: the run's :class:`~example_trainer.distributed.Dist`.
            policy: what the run trains (:func:`~example_trainer.policy.load_training_policy`).
            device: the torch device.
        """
        import torch

        self.config, self.dist, self.policy, self.device = config, dist, policy, device
        self.reference: Any = None  # frozen starting policy for the KL term, loaded on first need
        self.keep_logits = accepts_logits_to_keep(policy.model)
        # one prompt forward per group: needs logits_to_keep and a KV cache, and equal forwards
        # on every rank (FSDP collectives), so not sharded or with gradient checkpointing
        self.share_prefix = (config.shared_prefix and self.keep_logits and not dist.enabled
                             and not config.gradient_checkpointing)
        if config.shared_prefix and not self.share_prefix and dist.is_main:
            print("[grpo] shared_prefix: off (FSDP or gradient checkpointing): every rollout runs "
                  "its whole prompt", flush=True)
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16,
                                       enabled=config.mixed_precision == "bf16")
        tokenizer = policy.tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def run(self, step: int, batch: list[dict[str, Any]], progress: float = 0.0) -> dict[str, float]:
        """Train on ``batch`` (already checked groups) as step ``step``; return the step's metrics.

        Args:
            step: the step's number (1-based; sets the warm-up).
            batch: the step's groups, as ``GET /batch`` serves them.
            progress: the run's progress in [0, 1] for a decaying ``--lr-scheduler-type``
                (:func:`example_trainer.optimizer.schedule_progress`); ignored by ``constant``.

        Returns:
            The metrics ``metrics.jsonl`` logs for the step (loss, ratio, rewards, advantages,
            sampler agreement, tokens, ``lr``, ``grad_norm``, ``tokens_per_second``,
            ``step_seconds``). Per-sequence quantities are means over the batch's sequences.
        """
        import torch

        from example_trainer.data import batch_to_sequences, make_micro_batches
        from example_trainer.logprobs import token_logprobs
        from example_trainer.loss import METRIC_NAMES, grpo_loss, metric_dict, objective_options
        from example_trainer.optimizer import scheduled_lr

        config, dist, policy = self.config, self.dist, self.policy
        step_start = time.perf_counter()
        sequences, stats = batch_to_sequences(batch, config.scale_advantages)
        micro_batches = make_micro_batches(sequences, config.micro_batch_size, self.pad_id,
                                           config.pad_multiple, by_prefix=self.share_prefix)
        step_tokens = sum(int((mb.labels != IGNORE_INDEX).sum()) for mb in micro_batches)

        # ---------------------------------------------------------- loss and backward
        if config.kl_coef > 0 and self.reference is None and any(
                _needs_reference(mb) for mb in micro_batches):
            reference, _ = load_policy(config.model, policy.load_device, policy.dtype,
                                       config.attn_implementation)
            reference.requires_grad_(False)
            if config.mixed_precision == "bf16" and not dist.enabled:
                from example_trainer.memory import compact_frozen_linears, round_frozen_embeddings

                # the starting policy exactly as the trained one began: its embeddings rounded
                # the same way, and every Linear in bf16 (exact under autocast)
                if config.round_frozen_embeddings:
                    round_frozen_embeddings(reference, torch.bfloat16)
                compact_frozen_linears(reference, torch.bfloat16)
            self.reference = dist.shard(reference).eval()
        # step-wide normalisers (sequence or token counts) come from `sequences`/`stats` or
        # the whole list above; from here on each rank keeps only its share of micro-batches
        micro_batches = dist.my_share(micro_batches)  # all of them in a single process
        # On a GPU every read of a device value (`.item()`, `nonzero`) and every copy from
        # ordinary CPU memory waits for all queued work, leaving the GPU idle until the CPU
        # queues more. So what needs the CPU happens before the first forward (MicroBatch.staged),
        # and the loss's metrics are summed on the device and read back once, after the
        # optimizer step.
        attended_tokens = sum(float(mb.attention_mask.sum()) for mb in micro_batches)
        # the LM head runs only where completions are: prompt positions carry no loss
        staged = [mb.staged(self.device, tail=self.keep_logits) for mb in micro_batches]
        totals = None
        for keep, mb in staged:
            logits = policy_logits(policy.model, mb, keep, self.autocast, self.share_prefix)
            ref_lp = mb.ref_logprobs
            # rows the env sent none for; sharded, every rank runs the (collective) forward
            if config.kl_coef > 0 and self.reference is not None and (dist.enabled or _needs_reference(mb)):
                with torch.no_grad():
                    ref_logits = policy_logits(self.reference, mb, keep, self.autocast, self.share_prefix)
                    model_ref = token_logprobs(ref_logits, mb.labels, mb.temperatures)
                ref_lp = model_ref if ref_lp is None else torch.where(
                    torch.isnan(ref_lp), model_ref, ref_lp)
            out = grpo_loss(logits, mb.labels, mb.advantages, mb.sampler_logprobs,
                            num_sequences=stats.num_sequences, num_tokens=step_tokens,
                            temperature=mb.temperatures, ref_logprobs=ref_lp,
                            kl_coef=config.kl_coef, distill_token_ids=mb.distill_token_ids,
                            distill_logprobs=mb.distill_logprobs,
                            distill_coef=config.distill_coef, **objective_options(config))
            (out.loss * dist.grad_scale).backward()  # x N: FSDP averages over the N ranks
            totals = out.sums if totals is None else totals + out.sums

        # ---------------------------------------------------------- optimizer step
        lr = scheduled_lr(config.lr, step, warmup_steps=config.warmup_steps,
                          scheduler=config.lr_scheduler_type, progress=progress)
        for group in policy.optimizer.param_groups:
            group["lr"] = lr
        grad_norm = dist.scalar(torch.nn.utils.clip_grad_norm_(policy.trainable, config.max_grad_norm))
        policy.optimizer.step()
        policy.optimizer.zero_grad(set_to_none=True)
        sums = metric_dict(totals) if totals is not None else dict.fromkeys(METRIC_NAMES, 0.0)
        sums["attended_tokens"] = attended_tokens
        sums = dist.sum_metrics(sums)  # over ranks: each rank saw its share of the batch
        compute_s = time.perf_counter() - step_start

        n = stats.num_sequences
        scores = stats.scores
        sampler_tokens = max(sums["sampler_tokens"], 1.0)
        return {
            "loss": sums["loss"], "pg_loss": sums["pg_loss"] / n, "kl": sums["kl"] / n,
            "ratio": sums["ratio"] / n, "clip_fraction": sums["clip_fraction"] / n,
            "logprob": sums["logprob"] / n, "grad_norm": grad_norm, "lr": lr,
            "reward/mean": sum(scores) / n, "reward/max": max(scores), "reward/min": min(scores),
            "advantage/mean": sum(stats.advantages) / n,
            "advantage/abs_mean": sum(abs(a) for a in stats.advantages) / n,
            "sampler_logprob_diff": sums["sampler_logprob_diff_sum"] / sampler_tokens,
            "sampler_out_of_range": sums["sampler_out_of_range_tokens"] / sampler_tokens,
            "is_corrected_fraction": sums["is_corrected_tokens"] / sampler_tokens,
            "trained_tokens": sums["tokens"], "sequences": n, "groups": stats.num_groups,
            **({"distill_kl": sums["distill_kl_sum"] / sums["distill_tokens"]}
               if sums["distill_tokens"] else {}),
            "max_len": stats.max_len,
            # members the envs kept out of training (failed or masked), by outcome and kind
            **{f"rollouts_excluded/{key}": float(count) for key, count in stats.excluded.items()},
            "tokens_per_second": sums["attended_tokens"] / compute_s,  # all ranks together
            "step_seconds": compute_s,
        }


def _needs_reference(mb: Any) -> bool:
    """Whether some trained token of the micro-batch lacks a reference log-prob from the env."""
    if mb.ref_logprobs is None:
        return True
    return bool(mb.ref_logprobs.isnan()[mb.labels != IGNORE_INDEX].any())


__all__ = ["StepRunner"]
