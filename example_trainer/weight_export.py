"""The policy as the tensors a weight push carries: the trainer's half of a weight sync.

The transports in :mod:`atroposlib.inference.weights` take ``{HF name: tensor}``; turning a
training model (plain, peft-wrapped, FSDP-gathered) into those is the trainer's business: the
LoRA adapter merged in or saved alone, tied copies left out, only the blocks training changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _log(message: str) -> None:
    print(f"[grpo] {message}", flush=True)


class PolicyTensors:
    """Which tensors of the policy a push to inference nodes carries (chosen at the first push)."""

    def __init__(self) -> None:
        self._names: list[str] | None = None  # tensors a full push carries (chosen once)

    def changed_blocks(self, model: Any, state_dict: dict[str, Any] | None, copy: bool) -> dict[str, Any]:
        """The decoder blocks training changes (LoRA: merged), under their HF names.

        Args:
            model: the policy (plain, peft or FSDP-sharded).
            state_dict: its full state dict (gathered FSDP shards), or None to read the model.
            copy: copy the tensors (the push runs in the background while training changes them).

        Returns:
            ``{HF name: tensor}`` in the policy's dtype: every tensor of a block holding a
            trainable parameter (see :func:`~atroposlib.inference.weights.select.names_to_send`)
            and no tied copy (``lm_head.weight`` of tied embeddings).

        Raises:
            ValueError: no trainable parameter maps onto the exported weights.
        """
        from atroposlib.inference.weights.select import names_to_send, tied_names
        from example_trainer import lora

        hf_model, weights = lora.export(model, state_dict)  # LoRA: the adapter merged in
        weights = weights if weights is not None else hf_model.state_dict()
        if self._names is None:
            trainable = [n for n, p in model.named_parameters() if p.requires_grad]
            tied = tied_names(hf_model)
            self._names = [n for n in names_to_send(weights, trainable) if n not in tied]
            _log(f"weight pushes carry {len(self._names)} of {len(weights)} tensors (the blocks "
                 "training changes)")
        return {n: (weights[n].detach().clone() if copy else weights[n].detach()) for n in self._names}


def reload_tensors(model: Any, state_dict: dict[str, Any] | None, *, only_trained: bool,
                   dtype_name: str | None, snapshot: bool) -> tuple[Any, dict[str, Any]]:
    """The tensors a reload (or restart) of a vLLM server writes, and the HF model they belong to.

    Args:
        model: the policy (plain, peft or FSDP-sharded).
        state_dict: its full state dict (gathered FSDP shards), or None to read the model.
        only_trained: only the tensors training changes (the server holds the frozen ones);
            with LoRA, the merged tensors of every adapted block.
        dtype_name: vLLM's dtype (``"bfloat16"``) to cast floating tensors to; None keeps them.
        snapshot: copy what training will change (the write runs in the background).

    Returns:
        ``(hf_model, {HF name: tensor})``: the model whose ``config`` describes them (LoRA: the
        base model), and the tensors (tied ones still sharing storage).
    """
    from atroposlib.inference.weights.select import names_to_send
    from example_trainer.lora import export, is_lora
    from example_trainer.memory import sync_tensors, trained_names

    hf_model, weights = export(model, state_dict)  # LoRA: the adapter merged in
    weights = weights if weights is not None else hf_model.state_dict()
    lora_policy = is_lora(model)
    changed = set(names_to_send(weights, trained_names(model))) if lora_policy else trained_names(model)
    # merged LoRA weights are new tensors the optimizer never touches: no snapshot copy
    return hf_model, sync_tensors(weights, changed, only_trained, dtype_name,
                                  snapshot=snapshot and not lora_policy)


def adapter_tensors(model: Any, state_dict: dict[str, Any] | None,
                    adapter_dir: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Save the LoRA adapter into ``adapter_dir``; return its tensors and the push metadata.

    Returns:
        ``(tensors, metadata)``: the adapter tensors under peft's names, and ``metadata``
        carrying ``adapter_config.json`` as a LoRA push needs it.
    """
    from atroposlib.inference.weights.node_http import adapter_metadata
    from example_trainer import lora

    lora.save_adapter(model, adapter_dir.resolve(), state_dict)
    return adapter_metadata(adapter_dir)


def merged_reload_note(model: Any, served_model_name: str) -> str | None:
    """For a LoRA policy synced with ``--weight-sync reload``: how the adapter alone compares with a push of the merged blocks.

    Args:
        model: the policy; the note is for a peft model only.
        served_model_name: the name vLLM serves the policy under.

    Returns:
        One console line (the adapter's size in MiB and when ``--weight-sync lora`` sends less);
        None for a policy without an adapter.
    """
    from example_trainer.lora import is_lora

    if not is_lora(model):
        return None
    adapter = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "lora_" in n)
    return (f"LoRA run with --weight-sync reload: pushes carry the merged blocks (a delta "
            f"of their changed elements once vLLM holds the last version); the adapter alone is "
            f"{adapter / 2**20:.1f} MiB. When that is smaller than sync/bytes in metrics.jsonl, "
            "--weight-sync lora (or auto) sends only the adapter (the vLLM the trainer launches "
            f"serves it as {served_model_name}; --vllm-url servers as {served_model_name}-lora: "
            "point the environments at that name).")


__all__ = ["PolicyTensors", "adapter_tensors", "merged_reload_note", "reload_tensors"]
