"""One copy of each weight where one is enough: frozen layers in bf16, syncs of what training changed.

Savings for a policy trained with only its top layers (``--train-last-layers``), the first two exact:

* :func:`compact_frozen_linears`: under bf16 autocast every ``nn.Linear`` casts its fp32 weight
  to bf16 on each forward anyway, so a frozen Linear whose weight is stored in bf16 computes
  bit for bit the same, in half the memory (SmolLM2-135M with 10 of 30 layers trained: 71M
  frozen Linear weights, 142 MB less).
* :func:`sync_tensors`: the weights pushed to vLLM after a step need only the tensors training
  changed (the frozen ones are already there, unchanged since vLLM loaded them), copied only
  where they must be (cast to vLLM's dtype, or a snapshot that the optimizer must not change
  under a background writer); the rest is never copied.
* :func:`round_frozen_embeddings`: a frozen input embedding table stored in bf16, as vLLM holds
  it, with lookups returned in fp32. Not exact: the residual stream starts from bf16-rounded
  embeddings. For a tied LM head it saves twice (SmolLM2-135M: 113 MB of fp32 table, and the
  57 MB bf16 copy that autocast made of it for every forward).
"""

from __future__ import annotations

from typing import Any


def compact_frozen_linears(model: Any, dtype: Any) -> int:
    """Store the weights of frozen ``nn.Linear`` modules in ``dtype``, and own every weight.

    Exact only when every forward runs under ``torch.autocast(..., dtype=dtype)``: autocast
    casts a Linear's fp32 weight to ``dtype`` (round to nearest) on each call, the same value
    ``Tensor.to(dtype)`` gives once. A weight shared with a module that autocast does not
    cast (a tied LM head shares the input embeddings, whose lookup would then return
    ``dtype`` and change the residual stream) is left in its dtype, and so are biases.

    transformers loads safetensors weights as views of the memory-mapped file: a weight it
    reads stays resident as file pages for as long as any tensor maps the file. Every other
    parameter is therefore copied too (same dtype and values), so that once nothing maps the
    file its pages leave the process: without that the fp32 frozen weights read for the cast
    would stay resident beside their bf16 copies.

    Args:
        model: the policy (``torch.nn.Module``), after freezing.
        dtype: the autocast dtype (``torch.bfloat16``).

    Returns:
        Bytes the frozen Linear weights take less.
    """
    import torch

    # a peft LoRA wrapper exposes its base Linear's weight as ``.weight``: not a sharer
    shared = {id(m.weight) for m in model.modules()
              if not isinstance(m, torch.nn.Linear) and not hasattr(m, "base_layer")
              and isinstance(getattr(m, "weight", None), torch.Tensor)}
    freed = 0
    compacted: set[int] = set()
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if (not isinstance(module, torch.nn.Linear) or weight is None or weight.requires_grad
                or weight.dtype == dtype or not weight.is_floating_point() or id(weight) in shared):
            continue
        before = weight.numel() * weight.element_size()
        module.weight = torch.nn.Parameter(weight.detach().to(dtype, copy=True), requires_grad=False)
        compacted.add(id(module.weight))
        freed += before - module.weight.numel() * module.weight.element_size()
    with torch.no_grad():
        for param in model.parameters():  # each shared (tied) parameter once
            if id(param) not in compacted:
                param.data = param.data.clone()
    return freed


def round_frozen_embeddings(model: Any, dtype: Any) -> int:
    """Store a frozen input embedding table in ``dtype``; its lookups still return its old dtype.

    The table is rounded once (round to nearest, as ``Tensor.to`` and vLLM's loader do), and a
    forward hook casts each lookup back, so the layers above see the dtype they did before, with
    the rounded values. A module sharing the table (a tied LM head) gets the rounded table too:
    under ``torch.autocast(..., dtype=dtype)`` it computes exactly what it did, because autocast
    rounded the old table the same way on every forward (and kept that copy alive for the
    backward, which is now saved).

    Only for a policy whose every forward runs under autocast to ``dtype``: without autocast the
    tied LM head would meet activations of another dtype.

    Args:
        model: the policy (``torch.nn.Module`` with ``get_input_embeddings()``), after freezing.
        dtype: the autocast dtype (``torch.bfloat16``).

    Returns:
        Bytes the table takes less (0 when it is trained, already in ``dtype`` or not floating).
    """
    import torch

    embeddings = model.get_input_embeddings()
    table = getattr(embeddings, "weight", None)
    if (not isinstance(table, torch.Tensor) or table.requires_grad or table.dtype == dtype
            or not table.is_floating_point()):
        return 0
    lookup_dtype = table.dtype
    rounded = torch.nn.Parameter(table.detach().to(dtype, copy=True), requires_grad=False)
    for module in model.modules():  # the embeddings and whatever shares their table
        if getattr(module, "weight", None) is table:
            module.weight = rounded
    embeddings.register_forward_hook(lambda _module, _args, out: out.to(lookup_dtype))
    return table.numel() * (table.element_size() - rounded.element_size())


def trained_names(model: Any) -> set[str]:
    """Names of the parameters the optimizer changes (``requires_grad``), tied ones once."""
    return {name for name, param in model.named_parameters() if param.requires_grad}


def sync_tensors(state_dict: dict[str, Any], trained: set[str], only_trained: bool,
                 dtype_name: str | None, snapshot: bool) -> dict[str, Any]:
    """The tensors a weight sync writes, copied only where needed.

    Args:
        state_dict: the policy's full state dict (live tensors, or gathered FSDP shards).
        trained: the names the optimizer changes (:func:`trained_names`).
        only_trained: write only those (the server already holds the frozen ones).
        dtype_name: vLLM's dtype (``"bfloat16"``): floating tensors in another dtype are cast
            (a new tensor); None keeps each tensor's dtype.
        snapshot: the tensors are written in the background while training goes on: a
            trained tensor that the cast did not already copy is copied (frozen ones never
            change and are written as they are).

    Returns:
        ``{name: tensor}``. Tensors that share storage (tied embeddings) stay shared, so
        ``save_pretrained`` still recognises the tie.
    """
    import torch

    dtype = getattr(torch, dtype_name) if dtype_name else None
    done: dict[int, Any] = {}
    out = {}
    for name, tensor in state_dict.items():
        if only_trained and name not in trained:
            continue
        key = tensor.untyped_storage().data_ptr()
        if key not in done:
            cast = tensor.is_floating_point() and dtype is not None and tensor.dtype != dtype
            copy = cast or (snapshot and name in trained)
            done[key] = tensor.detach().to(dtype if cast else tensor.dtype, copy=copy)
        out[name] = done[key]
    return out


__all__ = ["compact_frozen_linears", "round_frozen_embeddings", "sync_tensors", "trained_names"]
