"""Which tensors a weight push carries, in which dtype, and their safetensors bytes.

A node starts from the same model as the trainer, so a push only needs the tensors training can
change: every decoder layer holding a trainable parameter (whole, because vLLM fuses q/k/v and
gate/up projections of a layer into one tensor and must receive all parts of it) and any other
trainable tensor (the final norm). With ``--train-last-layers 10`` on SmolLM2-135M that is 10 of
30 layers plus the norm; a full fine-tune sends everything once, tied copies (``lm_head`` tied to
the embeddings) left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

PEFT_PREFIX = "base_model.model."


def hf_name(param_name: str) -> str:
    """The HF model tensor a trainable parameter changes (peft adapter names mapped to their base weight).

    ``base_model.model.model.layers.3.self_attn.q_proj.lora_A.default.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``; plain names are returned unchanged.
    """
    name = param_name.removeprefix(PEFT_PREFIX)
    if ".lora_" in name:
        return name.split(".lora_", 1)[0] + ".weight"
    return name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")


def layer_key(name: str) -> str | None:
    """The decoder block a tensor belongs to: its name up to the first integer segment.

    ``model.layers.28.mlp.up_proj.weight`` -> ``model.layers.28``; None for tensors outside
    the numbered blocks (embeddings, final norm, LM head).
    """
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return None


def names_to_send(all_names: Iterable[str], trainable: Iterable[str]) -> list[str]:
    """The tensors of ``all_names`` that training can change, whole blocks at a time.

    Args:
        all_names: every tensor name of the exported HF state dict.
        trainable: names of the trainable parameters (HF or peft names).

    Returns:
        In ``all_names`` order: every tensor of a block (:func:`layer_key`) that holds a trainable
        tensor, and every trainable tensor outside the blocks.

    Raises:
        ValueError: nothing trainable maps onto ``all_names`` (a naming mismatch: better to stop
            than to push nothing and leave the nodes on the starting model forever).
    """
    names = list(all_names)
    known = set(names)
    changed = {hf_name(n) for n in trainable} & known
    if not changed:
        raise ValueError("no trainable parameter maps onto the exported weights; cannot tell which "
                         "tensors to push (report this, with the model's architecture)")
    blocks = {layer_key(n) for n in changed} - {None}
    return [n for n in names if n in changed or layer_key(n) in blocks]


def tied_names(hf_model: Any) -> set[str]:
    """Names of tensors that are tied copies of another (``lm_head.weight`` when embeddings are tied)."""
    config = getattr(hf_model, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return set()
    tied = getattr(hf_model, "_tied_weights_keys", None) or ["lm_head.weight"]
    return set(tied.keys() if isinstance(tied, dict) else tied)


def select(weights: dict[str, Any], names: list[str], dtype_name: str | None) -> dict[str, Any]:
    """``weights`` restricted to ``names``, floating tensors cast to ``dtype_name`` (None: kept), contiguous on the CPU.

    Tensors are copied only where a cast, a move or a layout change needs it. Two names sharing
    one storage (tied weights, left out by :func:`tied_names`) are copied apart, since
    safetensors refuses shared storage.
    """
    import torch

    dtype = getattr(torch, dtype_name) if dtype_name else None
    out = {}
    seen: set[int] = set()
    for name in names:
        tensor = weights[name].detach()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensor = tensor.to("cpu").contiguous()
        key = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if key in seen else tensor
        seen.add(key)
    return out


def serialize(tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> bytes:
    """The safetensors file of ``tensors`` as bytes (what ``PUT /atropos/weights`` takes)."""
    from safetensors.torch import save

    return save(tensors, metadata=metadata)


def unique_storage(tensors: dict[str, Any]) -> dict[str, Any]:
    """``tensors`` without those sharing storage with an earlier one (tied weights: the first name kept)."""
    seen: set[int] = set()
    unique = {}
    for name, tensor in tensors.items():
        key = tensor.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            unique[name] = tensor
    return unique


def save_tensors(tensors: dict[str, Any], path: Any) -> None:
    """Write ``tensors`` as one safetensors file at ``path``.

    A tensor sharing storage with an earlier one is written once, under the first name, as
    ``save_pretrained`` does for tied weights.
    """
    from safetensors.torch import save_file

    unique = {n: t.contiguous() for n, t in unique_storage(tensors).items()}
    save_file(unique, str(path), metadata={"format": "pt"})


__all__ = ["hf_name", "layer_key", "names_to_send", "save_tensors", "select", "serialize", "tied_names",
           "unique_storage"]
