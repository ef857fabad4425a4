"""LoRA for the GRPO trainer (peft): wrap the policy, save/restore the adapter, export merged weights.

LoRA (Hu et al. 2021, arXiv:2106.09685, eq. 3) freezes each targeted weight ``W`` and trains a
low-rank update: ``h = W x + (alpha / r) * B A x`` with ``A: [r, in]``, ``B: [out, r]`` (``B``
starts at zero, so the wrapped model starts equal to the base one).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

#: Every linear projection of attention and MLP in Llama-style decoders (Llama, Qwen, Mistral, SmolLM).
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def apply_lora(model: Any, *, r: int, alpha: float, dropout: float, target_modules: list[str],
               last_layers: int | None = None) -> Any:
    """Wrap ``model`` in a peft LoRA model; only the adapter stays trainable.

    Args:
        model: a HF causal LM.
        r: adapter rank (>= 1).
        alpha: scaling numerator (the update is scaled by ``alpha / r``).
        dropout: dropout on the adapter input.
        target_modules: module-name suffixes to adapt (e.g. ``q_proj``).
        last_layers: adapt only the last N decoder layers (``--train-last-layers``); None: all.

    Returns:
        The ``peft.PeftModel``.

    Raises:
        ValueError: no module of the model matches ``target_modules``, or ``last_layers``
            exceeds the number of decoder layers.
    """
    from peft import LoraConfig, get_peft_model

    layers_to_transform = None
    if last_layers:
        layers = getattr(getattr(model, "model", None), "layers", None)
        if layers is None or last_layers > len(layers):
            raise ValueError(
                f"train_last_layers={last_layers}: the model has "
                f"{'no model.layers' if layers is None else len(layers)} decoder layers; lower it "
                "or leave it unset to adapt every layer")
        layers_to_transform = list(range(len(layers) - last_layers, len(layers)))
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                        target_modules=list(target_modules), layers_to_transform=layers_to_transform,
                        task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                        if type(m).__name__ == "Linear"})
        raise ValueError(f"--lora-target-modules {','.join(target_modules)} matches no module of "
                         f"the model ({exc}); its linear layers are named: {', '.join(names)}") from exc


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a peft-wrapped model."""
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def save_adapter(model: Any, out_dir: Path) -> None:
    """Save only the adapter (``adapter_config.json`` + ``adapter_model.safetensors``)."""
    model.save_pretrained(str(out_dir), safe_serialization=True)


def load_adapter(model: Any, adapter_dir: Path) -> None:
    """Load adapter weights saved by :func:`save_adapter` into the LoRA model ``model``.

    Raises:
        FileNotFoundError: ``adapter_dir`` holds no ``adapter_model.safetensors``.
        ValueError: the saved adapter does not fit (other rank or target modules).
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(adapter_dir) / "adapter_model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; the checkpoint holds no LoRA adapter")
    result = set_peft_model_state_dict(model, load_file(str(path)))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise ValueError(f"the adapter in {adapter_dir} does not fit this model (missing "
                         f"{missing[:3]}, unexpected {list(result.unexpected_keys)[:3]}); resume "
                         "with the original run's --lora-r and --lora-target-modules")


def merged_copy(model: Any) -> Any:
    """A plain HF model with the adapter merged in (``W + (alpha/r) B A``); ``model`` is untouched.

    Costs one extra copy of the weights in memory while it lives.
    """
    return copy.deepcopy(model).merge_and_unload()


def export_model(model: Any) -> Any:
    """The model to save as a full HF directory: merged copy for LoRA, else ``model`` itself."""
    return merged_copy(model) if is_lora(model) else model
