"""The policy's optimizer: AdamW, with its two moments in fp32 (torch) or in 8 bits (bitsandbytes).

AdamW keeps two moments per trained parameter (Loshchilov & Hutter 2019, "Decoupled Weight
Decay Regularization", Algorithm 2): in fp32 that is 8 bytes per parameter, twice the fp32
weights themselves. On the quickstart (top 10 of SmolLM2-135M's 30 layers trained, 35.4M
parameters) that is 270 MiB, the trainer's largest tensor after the weights.

* ``adamw_torch``: ``torch.optim.AdamW``, both moments in fp32 (the default).
* ``adamw_bnb_8bit``: bitsandbytes' ``AdamW8bit``, 8-bit block-wise quantized moments
  (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization", section 2): 2 bytes
  per parameter plus one fp32 scale per block of 256 (bitsandbytes' CPU block size), so about
  a quarter of the state. Tensors under 4,096 elements (norms) keep fp32 moments, as
  bitsandbytes does by default. It runs on CPU and CUDA; on one CPU thread its step is
  about 4x torch's (about 1.1 s against 0.27 s for the quickstart's 35.4M parameters). In the
  quickstart's loop on a 2-core CPU that made the trainer set the pace: 115 steps in 14 minutes
  against 161-169 with ``adamw_torch``, and lower accuracy, for 0.16 GiB less at the trainer's
  peak (docs: Benchmarks, Memory). It is for a machine short of memory, not of time.

The names are those of Hugging Face's ``TrainingArguments.optim`` (which TRL uses), so a
setting carries over.

The learning rate of each step comes from :func:`scheduled_lr`: a linear warm-up, then a
constant, linear or cosine schedule (``--lr-scheduler-type``, Hugging Face's names). A run
with a time budget (``--max-train-seconds``) rarely knows its last step, so the schedule's
progress is the larger of the steps done and the budget used.
"""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

#: An optimizer name, as ``--optim`` takes it (the trainer config's type).
OptimizerName = Literal["adamw_torch", "adamw_bnb_8bit"]
#: The optimizer names, in order.
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)
#: A learning-rate schedule after warm-up, as ``--lr-scheduler-type`` takes it.
LRSchedulerName = Literal["constant", "linear", "cosine"]
#: The schedule names, in order.
LR_SCHEDULERS: tuple[str, ...] = get_args(LRSchedulerName)


def build_optimizer(name: str, params: list[Any], *, lr: float, betas: tuple[float, float],
                    weight_decay: float, sharded: bool = False) -> Any:
    """Build the optimizer ``name`` over ``params``.

    Args:
        name: one of :data:`OPTIMIZERS`.
        params: the trained parameters (``requires_grad``), as a list.
        lr: learning rate (the step overrides it per step for warm-up).
        betas: AdamW's (beta1, beta2).
        weight_decay: decoupled weight decay.
        sharded: the parameters are FSDP2-sharded ``DTensor`` s (a multi-rank run).

    Returns:
        A ``torch.optim.Optimizer``.

    Raises:
        ValueError: ``name`` is unknown, or ``adamw_bnb_8bit`` with sharded parameters
            (bitsandbytes quantizes plain tensors, not FSDP2's DTensor shards).
        ImportError: ``adamw_bnb_8bit`` without bitsandbytes installed (the message says how
            to install it).
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer {name!r} is not one of {', '.join(OPTIMIZERS)}")
    if name == "adamw_torch":
        import torch

        return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
    if sharded:
        raise ValueError("--optim adamw_bnb_8bit does not run on FSDP2-sharded parameters (a "
                         "multi-rank run); use --optim adamw_torch there")
    try:
        import bitsandbytes as bnb
    except ImportError as exc:
        raise ImportError("--optim adamw_bnb_8bit needs bitsandbytes: pip install "
                          "'atroposlib[trainer]' (or pip install 'bitsandbytes>=0.50')") from exc
    return bnb.optim.AdamW8bit(params, lr=lr, betas=betas, weight_decay=weight_decay)


def schedule_progress(step: int, training_steps: int, elapsed_seconds: float | None = None,
                      budget_seconds: float | None = None) -> float:
    """How far through the run step ``step`` is, in [0, 1], for a decaying schedule.

    Args:
        step: the optimizer step about to run (1-based).
        training_steps: the run's step limit (``--training-steps``), >= 1.
        elapsed_seconds: training time used so far (seconds; evaluations excluded), or None.
        budget_seconds: the time budget (``--max-train-seconds``), or None for none.

    Returns:
        ``max((step - 1) / training_steps, elapsed_seconds / budget_seconds)``, clipped to
        [0, 1]: the share of the run done before this step, by whichever limit the run will
        hit first. Step 1 starts at 0 (the full lr), and the last of ``training_steps`` still
        trains (at 1 / training_steps of it, linearly), as in Hugging Face's schedules.
    """
    progress = (step - 1) / max(training_steps, 1)
    if budget_seconds and elapsed_seconds is not None:
        progress = max(progress, elapsed_seconds / budget_seconds)
    return min(max(progress, 0.0), 1.0)


def scheduled_lr(base_lr: float, step: int, *, warmup_steps: int = 0,
                 scheduler: str = "constant", progress: float = 0.0) -> float:
    """The learning rate of step ``step``.

    ``base_lr * min(1, step / warmup_steps) * decay(progress)``, where decay is 1 for
    ``constant``, ``1 - p`` for ``linear`` and ``(1 + cos(pi p)) / 2`` for ``cosine``
    (Loshchilov & Hutter 2017, "SGDR: Stochastic Gradient Descent with Warm Restarts",
    eq. 5 with eta_min = 0 and one period). Both decays reach 0 at the end of the run, as
    Hugging Face's ``get_linear_schedule_with_warmup`` and ``get_cosine_schedule_with_warmup``
    do; unlike them, progress runs over the whole run, warm-up included, because a run with a
    time budget does not know its step count in advance.

    Args:
        base_lr: the peak learning rate (``--lr``).
        step: the step about to run (1-based).
        warmup_steps: linear warm-up over this many steps (0: none).
        scheduler: one of :data:`LR_SCHEDULERS`.
        progress: the run's progress in [0, 1] (:func:`schedule_progress`).

    Returns:
        The learning rate (same unit as ``base_lr``).

    Raises:
        ValueError: ``scheduler`` is unknown.
    """
    if scheduler not in LR_SCHEDULERS:
        raise ValueError(f"lr scheduler {scheduler!r} is not one of {', '.join(LR_SCHEDULERS)}")
    lr = base_lr * min(1.0, step / warmup_steps) if warmup_steps else base_lr
    if scheduler == "linear":
        return lr * (1.0 - progress)
    if scheduler == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes held by the optimizer's state tensors (moments, quantization maps and scales).

    Args:
        optimizer: a ``torch.optim.Optimizer`` that has stepped at least once (state is lazy).

    Returns:
        The sum of ``numel * element_size`` over every tensor in ``optimizer.state``.
    """
    import torch

    return sum(value.numel() * value.element_size() for state in optimizer.state.values()
               for value in state.values() if isinstance(value, torch.Tensor))


__all__ = ["LR_SCHEDULERS", "LRSchedulerName", "OPTIMIZERS", "OptimizerName", "build_optimizer",
           "optimizer_state_bytes", "schedule_progress", "scheduled_lr"]
