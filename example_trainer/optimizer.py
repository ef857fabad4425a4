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
"""

from __future__ import annotations

from typing import Any, Literal, get_args

#: An optimizer name, as ``--optim`` takes it (the trainer config's type).
OptimizerName = Literal["adamw_torch", "adamw_bnb_8bit"]
#: The optimizer names, in order.
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)


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


__all__ = ["OPTIMIZERS", "OptimizerName", "build_optimizer", "optimizer_state_bytes"]
