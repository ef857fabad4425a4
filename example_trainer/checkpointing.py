"""Activation checkpointing for the policy's decoder layers: full, or selective (matmul outputs kept).

Backward needs what the forward computed. Checkpointing keeps less of it and recomputes the rest
in backward: memory for compute.

* ``full``: Hugging Face's gradient checkpointing. Each decoder layer keeps only its input and
  runs its whole forward again in backward.
* ``selective``: each decoder layer keeps the outputs of its matrix multiplications and
  attention, and recomputes the cheap ops between them in backward: norms, activation
  functions, casts, softmax, residual adds. This is torch's selective activation checkpointing
  (``torch.utils.checkpoint.create_selective_checkpoint_contexts``), with the op choice used by
  torchtitan's "op" mode: save what is expensive to recompute, drop what is large and cheap.

Measured on the quickstart's step (SmolLM2-135M, top 10 of 30 layers trained, bf16 autocast,
micro-batch 4, one CPU thread; ``benchmarks/bench_step_memory.py``, docs: Benchmarks, Memory):
full cut the step's rise over the resting trainer from 447 to 341 MiB at 1.12x the step time;
selective cut it to 379 MiB at 1.41x. A likely reason, not measured: on a small model on a CPU,
the Python policy call selective checkpointing makes for every op costs more than the matmuls
it spares. It is meant for larger models, where recomputing a matmul is the expensive part.

Both modes drop the hook Hugging Face adds to make the input embeddings' output require grad.
Reentrant checkpointing needed it; these modes are non-reentrant, and with frozen bottom layers
(``train_last_layers``) the hook made backward run through every frozen layer too (an earlier
measurement of full checkpointing with the hook in place gave 1.6-2x the step time).
"""

from __future__ import annotations

import functools
from typing import Any, Literal, get_args

#: A checkpointing mode, as ``--gradient-checkpointing-mode`` takes it (the trainer config's type).
CheckpointMode = Literal["full", "selective"]
#: The checkpointing modes, in order.
CHECKPOINT_MODES: tuple[str, ...] = get_args(CheckpointMode)


@functools.lru_cache(maxsize=1)
def _saved_ops() -> tuple[frozenset, Any, Any]:
    """The ops selective checkpointing keeps (matmuls, fused attention), and the two policy values.

    Looked up once: the policy runs for every op.
    """
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention")
    saved = frozenset(getattr(aten, name).default for name in names if hasattr(aten, name))
    return saved, CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE


def keep_matmul_outputs(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """Selective checkpointing's policy: keep what :func:`_saved_ops` names, recompute the rest.

    Called by torch for every op run inside a checkpointed layer (see
    ``torch.utils.checkpoint.create_selective_checkpoint_contexts``).

    Returns:
        ``CheckpointPolicy.MUST_SAVE`` for a matmul or fused attention op,
        ``CheckpointPolicy.PREFER_RECOMPUTE`` for any other.
    """
    saved, must_save, prefer_recompute = _saved_ops()
    return must_save if op in saved else prefer_recompute


def checkpoint_kwargs(mode: str) -> dict[str, Any]:
    """The ``gradient_checkpointing_kwargs`` for Hugging Face's ``gradient_checkpointing_enable``.

    Both modes are non-reentrant ``torch.utils.checkpoint``, named explicitly: gradients then
    reach a checkpointed layer's weights even when its input does not require grad (frozen
    layers below it), which reentrant checkpointing would not do.

    Args:
        mode: ``full`` or ``selective`` (:data:`CHECKPOINT_MODES`).

    Returns:
        ``{"use_reentrant": False}``, plus for ``selective`` a ``context_fn`` applying
        :func:`keep_matmul_outputs`.

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in CHECKPOINT_MODES:
        raise ValueError(f"gradient checkpointing mode {mode!r} is not one of {', '.join(CHECKPOINT_MODES)}")
    if mode == "full":
        return {"use_reentrant": False}
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return {"use_reentrant": False,
            "context_fn": functools.partial(create_selective_checkpoint_contexts, keep_matmul_outputs)}


def enable_checkpointing(model: Any, mode: str) -> None:
    """Turn on activation checkpointing of ``model``'s decoder layers (a Hugging Face model).

    Args:
        model: a ``transformers`` model (or a peft model wrapping one).
        mode: ``full`` or ``selective`` (:data:`CHECKPOINT_MODES`).

    Raises:
        ValueError: an unknown ``mode``.
    """
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs(mode))
    # not needed without reentrant checkpointing, and it backpropagates through frozen layers
    if hasattr(model, "disable_input_require_grads"):
        model.disable_input_require_grads()


__all__ = ["CHECKPOINT_MODES", "CheckpointMode", "checkpoint_kwargs", "enable_checkpointing", "keep_matmul_outputs"]
