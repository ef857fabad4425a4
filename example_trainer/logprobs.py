"""Per-token log-probs of label tokens from a policy's logits, the largest tensors of a training step.

:func:`token_logprobs` is what every loss in :mod:`example_trainer.loss` (and the KL reference)
reads; :func:`scaled_logits` divides logits by per-sequence sampling temperatures for the terms
that need the whole distribution (teacher distillation).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported lazily so `atropos-grpo --help` stays fast
    import torch


def scaled_logits(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """``logits / temperature`` in float32, per sequence.

    Args:
        logits: ``[B, T, V]``.
        temperature: ``[B]``, ``[B, 1]`` or ``[B, 1, 1]``; values <= 0 are treated as 1. None: 1.

    Returns:
        ``[B, T, V]`` float32 logits (the input itself when it is already float32 and every
        temperature is 1: no second ``[B, T, V]`` tensor, nor its gradient, for a division by 1).
    """
    logits = logits.float()
    temp = _sequence_temperatures(temperature, logits.shape[0], logits.device)
    return logits if temp is None else logits / temp.view(-1, 1, 1)


def _sequence_temperatures(temperature: Any, batch: int, device: Any) -> Any:
    """``[batch]`` float32 temperatures, values <= 0 read as 1; None when every one is 1."""
    import torch

    if temperature is None:
        return None
    temp = temperature.reshape(-1).to(device=device, dtype=torch.float32).expand(batch)
    temp = torch.where(temp > 0, temp, torch.ones_like(temp))
    return None if bool((temp == 1).all()) else temp


#: Elements of the float32 ``[rows, V]`` block that :func:`token_logprobs` computes at once, by
#: device type. On a CPU the block is a step's largest temporary, so it is small (16 MiB: 85 rows
#: of a 49k vocabulary); on a GPU fewer, larger blocks launch fewer kernels (1 GiB).
LOGPROB_BLOCK_ELEMENTS = {"cpu": 2**22, "cuda": 2**28}


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probability of each label token under ``softmax(logits / temperature)``.

    Computed in float32, a block of rows at a time (:data:`LOGPROB_BLOCK_ELEMENTS`), from logits
    of any float dtype: the backward keeps only the logits as given (bf16 under autocast) and
    one float per row, never a float32 ``[B, T, V]`` copy, its log-softmax or their gradients.
    For bf16 logits that is 4x less memory than ``log_softmax(logits.float())`` keeps for its
    backward (the float32 log-softmax, plus the float32 logits the caller still holds), with the
    same values and gradients up to float32 rounding.

    Args:
        logits: ``[B, T, V]`` next-token logits (position t predicts ``labels[:, t]``); any
            float dtype, any strides.
        labels: ``[B, T]`` token ids; ``-100`` marks positions to ignore (their log-prob is 0).
        temperature: ``[B]``, ``[B, 1]`` or ``[B, 1, 1]`` sampling temperature per sequence;
            values <= 0 are treated as 1. None means 1.

    Returns:
        ``[B, T]`` float32 log-probs (0 at ignored positions); the gradient flows to ``logits``
        in their dtype.
    """
    batch, steps, vocab = logits.shape
    temp = _sequence_temperatures(temperature, batch, logits.device)
    if temp is not None:
        temp = temp.repeat_interleave(steps)  # one per row
    block = LOGPROB_BLOCK_ELEMENTS.get(logits.device.type, LOGPROB_BLOCK_ELEMENTS["cpu"])
    rows = max(1, block // vocab)
    flat = logits.reshape(batch * steps, vocab)  # a copy only for a view that cannot be flattened
    out = _label_logprob_fn().apply(flat, labels.reshape(-1), temp, rows)
    return out.view(batch, steps)


@functools.cache
def _label_logprob_fn() -> Any:
    """The autograd Function behind :func:`token_logprobs`, built on first use (torch is lazy)."""
    import torch

    def block_logits(logits: torch.Tensor, temp: torch.Tensor | None, start: int, end: int) -> torch.Tensor:
        x = logits[start:end].float()
        return x if temp is None else x / temp[start:end, None]

    class LabelLogprob(torch.autograd.Function):
        """``x[label] - logsumexp(x)`` per row of ``x = logits / temp``, one block of rows at a time.

        The gradient with respect to ``x`` is ``g * (onehot(label) - softmax(x))``, and with
        respect to the logits that divided by the row's temperature.
        """

        @staticmethod
        def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor, temp: torch.Tensor | None,
                    rows: int) -> torch.Tensor:
            ignored = labels == -100
            index = labels.clamp(min=0).unsqueeze(1)
            out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
            lse = torch.empty_like(out)
            for start in range(0, logits.shape[0], rows):
                end = start + rows
                x = block_logits(logits, temp, start, end)
                lse[start:end] = torch.logsumexp(x, dim=-1)
                out[start:end] = x.gather(1, index[start:end]).squeeze(1) - lse[start:end]
            out.masked_fill_(ignored, 0.0)
            ctx.save_for_backward(logits, index, ignored, lse, temp)
            ctx.rows = rows
            return out

        @staticmethod
        def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            logits, index, ignored, lse, temp = ctx.saved_tensors
            g = grad_out.float().masked_fill(ignored, 0.0)
            if temp is not None:
                g = g / temp
            grad = torch.empty_like(logits)
            for start in range(0, logits.shape[0], ctx.rows):
                end = start + ctx.rows
                # softmax; not in place: float32 logits come back from block_logits uncopied
                p = (block_logits(logits, temp, start, end) - lse[start:end, None]).exp_()
                p.mul_(-g[start:end, None]).scatter_add_(1, index[start:end], g[start:end, None])
                grad[start:end] = p
            return grad, None, None, None

    return LabelLogprob


__all__ = ["LOGPROB_BLOCK_ELEMENTS", "scaled_logits", "token_logprobs"]
