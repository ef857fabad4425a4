"""LoRA for the GRPO trainer (peft): wrap the policy, save/restore the adapter, export merged weights.

LoRA (Hu et al. 2021, arXiv:2106.09685, eq. 3) freezes each targeted weight ``W`` and trains a
low-rank update: ``h = W x + (alpha / r) * B A x`` with ``A: [r, in]``, ``B: [out, r]`` (``B``
starts at zero, so the wrapped model starts equal to the base one).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

# peft imports bitsandbytes when it is installed (it is: `--optim adamw_bnb_8bit`), and on CPUs with
# AVX512_BF16 bitsandbytes warns at import that it cannot load its 4-bit (QLoRA) matmul kernel from
# the `kernels` package. LoRA here never quantizes, so the warning only alarms: keep that one logger quiet.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

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


def save_adapter(model: Any, out_dir: Path, state_dict: dict[str, Any] | None = None) -> None:
    """Save only the adapter (``adapter_config.json`` + ``adapter_model.safetensors``).

    Args:
        model: the peft model (plain or FSDP2-sharded).
        out_dir: directory to write.
        state_dict: the model's full state dict (gathered from the FSDP shards, CPU tensors);
            None to read the (unsharded) model's own. peft picks the adapter tensors out of it.
    """
    model.save_pretrained(str(out_dir), safe_serialization=True, state_dict=state_dict)


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


def merged_state_dict(model: Any, state_dict: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plain HF weights with the adapter folded in; ``model`` is left untouched.

    Every adapted linear layer ``W`` (``[out, in]``) becomes ``W + scaling * B @ A`` with
    ``A: [r, in]``, ``B: [out, r]`` and ``scaling = alpha / r`` (``alpha / sqrt(r)`` with rsLoRA),
    the update of Hu et al. 2021 (arXiv:2106.09685, eq. 3) as peft's ``LoraLayer.get_delta_weight``
    computes it (transposed for ``fan_in_fan_out`` layers). The same function serves the single
    process (the model's own tensors) and FSDP2 (the full state dict gathered from the shards):
    only the module attributes (``scaling``, ``fan_in_fan_out``) are read from ``model``.

    Args:
        model: the peft LoRA model (plain or sharded).
        state_dict: its full state dict under the peft names (``base_model.model.…``); None to
            read the unsharded model's own.

    Returns:
        ``{HF name: tensor}`` as the base model names its weights (``model.layers.0…``), adapter
        tensors left out; loadable by ``AutoModelForCausalLM.from_pretrained``.

    Raises:
        NotImplementedError: the adapter uses DoRA (its merge needs the weight norms).
    """
    from peft.tuners.lora import LoraLayer

    state = model.state_dict() if state_dict is None else state_dict
    adapter = model.active_adapter
    merged: dict[str, Any] = {}
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer) or adapter not in module.lora_A:
            continue
        if module.use_dora.get(adapter, False):
            raise NotImplementedError("merging a DoRA adapter is not supported; train with plain LoRA")
        weight = state[f"{name}.base_layer.weight"]
        a, b = state[f"{name}.lora_A.{adapter}.weight"], state[f"{name}.lora_B.{adapter}.weight"]
        delta = b.float() @ a.float()
        if module.fan_in_fan_out:
            delta = delta.T
        merged[f"{name}.base_layer.weight"] = (weight.float() + delta * module.scaling[adapter]).to(weight.dtype)
    prefix = "base_model.model."
    out = {}
    for key, tensor in state.items():
        if ".lora_" in key:
            continue
        plain = key.removeprefix(prefix).replace(".base_layer.", ".")
        out[plain] = merged.get(key, tensor)
    return out


def export(model: Any, state_dict: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any] | None]:
    """What to pass to ``save_pretrained`` to write the policy as a full HF model directory.

    Args:
        model: the policy (plain, peft-wrapped, sharded or not).
        state_dict: its full state dict gathered from the FSDP shards, or None in one process.

    Returns:
        ``(hf_model, state_dict)``: for LoRA, the base HF model and the merged weights
        (:func:`merged_state_dict`); otherwise ``model`` and ``state_dict`` unchanged.
    """
    if not is_lora(model):
        return model, state_dict
    return model.get_base_model(), merged_state_dict(model, state_dict)
