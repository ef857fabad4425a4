"""Which weight-sync path a run takes when ``weight_sync`` is ``auto``: the adapter or the weights.

A LoRA run can update its sampler two ways: push the adapter alone (``lora``: vLLM's LoRA
loading, ``A: [r, in]`` and ``B: [out, r]`` per adapted module) or push the adapted modules'
merged weights (``reload``: ``W + scaling * B @ A``, ``[out, in]`` each, Hu et al. 2021,
arXiv:2106.09685, eq. 3). The adapter is ``r * (in + out)`` elements against ``in * out``, so it
is smaller whenever ``r < in * out / (in + out)``, e.g. for every rank below 288 on a 576-wide
square projection. :func:`choose_weight_sync` compares the two in bytes and picks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The ``--max-lora-rank`` values vLLM accepts; a run's rank is served in the smallest that fits.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class SyncChoice:
    """The weight-sync path of a run and why.

    Attributes:
        mode: ``reload``, ``restart``, ``lora`` or ``none``.
        adapter_bytes: bytes of the adapter's tensors as the trainer saves them (0: not LoRA).
        merged_bytes: bytes of the adapted modules' merged weights at the push dtype (0: not LoRA).
        why: one line for the log (empty when the user set the mode).
    """

    mode: str
    adapter_bytes: int = 0
    merged_bytes: int = 0
    why: str = ""


def lora_rank_slot(r: int) -> int:
    """The ``--max-lora-rank`` to start vLLM with for adapters of rank ``r`` (>= 1).

    Raises:
        ValueError: ``r`` is above 512, the largest rank vLLM serves.
    """
    for slot in VLLM_LORA_RANKS:
        if slot >= r:
            return slot
    raise ValueError(f"lora_r={r}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}; lower "
                     "--lora-r or use --weight-sync reload (the adapter merged in)")


def push_dtype(vllm_dtype: str) -> str:
    """The dtype merged weights are pushed at.

    ``vllm_dtype``, or for ``auto`` what vLLM serves (float32 on a CPU build, bfloat16 on a GPU).
    """
    if vllm_dtype != "auto":
        return vllm_dtype
    from atroposlib.inference.vllm_process import vllm_is_cpu_build

    return "float32" if vllm_is_cpu_build() else "bfloat16"


def lora_push_bytes(model: Any, dtype: str) -> tuple[int, int]:
    """``(adapter bytes, merged bytes)`` of one sync of the peft LoRA model ``model``.

    Read from the parameters' shapes and dtypes only (FSDP2-sharded ``DTensor`` parameters report
    their global shape), so every rank computes the same numbers without gathering.

    Args:
        model: a ``peft`` LoRA model.
        dtype: the push dtype of merged weights (``float32``, ``bfloat16``, ``float16``).

    Returns:
        The adapter's ``lora_A`` + ``lora_B`` bytes at their own dtype, and the adapted modules'
        base-weight element count times the push dtype's size.
    """
    from peft.tuners.lora import LoraLayer

    adapter_name = model.active_adapter
    adapter = merged = 0
    for module in model.modules():
        if not isinstance(module, LoraLayer) or adapter_name not in module.lora_A:
            continue
        for part in (module.lora_A[adapter_name].weight, module.lora_B[adapter_name].weight):
            adapter += part.numel() * part.element_size()
        merged += module.get_base_layer().weight.numel() * _DTYPE_BYTES[dtype]
    return adapter, merged


def choose_weight_sync(config: Any, model: Any, managed: bool, cpu_build: bool | None = None) -> SyncChoice:
    """Resolve ``config.weight_sync`` for this run; a mode the user set is kept as it is.

    ``auto`` picks ``lora`` for a LoRA run whose adapter is smaller than the merged weights it
    updates, when the trainer launches vLLM itself (``managed``): that vLLM then serves the
    adapter under ``served_model_name``, so environments keep requesting the name they know. With
    ``--vllm-url`` servers the adapter would be served under another name (``<name>-lora``) that
    environments do not request, so ``auto`` keeps the weight push there (``--weight-sync lora``
    still opts in). A CPU build of vLLM also keeps ``reload``: there the push is a local
    reload of a few megabytes either way, while serving through an adapter cost more sampling
    time and memory than it saved (the quickstart, same machine, one run each: 15 steps
    against 17 in 7 minutes, about the same held-out accuracy, a higher peak RSS:
    ``benchmarks/results/bench_lora_sync_{auto,reload}_2026-12-07.json``). Everything else is
    ``reload``.

    Args:
        config: the :class:`~example_trainer.config.TrainerConfig`.
        model: the policy (a peft model for LoRA runs).
        managed: the trainer launches the vLLM it syncs (no ``--vllm-url``).
        cpu_build: the installed vLLM is a CPU build (None: detect it).

    Returns:
        The :class:`SyncChoice`, with both byte counts for a LoRA run.
    """
    from example_trainer.lora import is_lora

    if config.weight_sync != "auto":
        return SyncChoice(config.weight_sync)
    if not is_lora(model):
        return SyncChoice("reload")  # a full fine-tune: nothing to choose, nothing logged
    dtype = push_dtype(config.vllm_dtype)
    adapter, merged = lora_push_bytes(model, dtype)
    sizes = f"adapter {adapter / 2**20:.2f} MiB, merged modules {merged / 2**20:.2f} MiB at {dtype}"
    if not managed:
        return SyncChoice("reload", adapter, merged, f"reload ({sizes}; --vllm-url servers would "
                          "serve the adapter under another name, --weight-sync lora opts in)")
    if config.lora_r > VLLM_LORA_RANKS[-1]:
        return SyncChoice("reload", adapter, merged,
                          f"reload ({sizes}; vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]})")
    if cpu_build is None:
        from atroposlib.inference.vllm_process import vllm_is_cpu_build

        cpu_build = vllm_is_cpu_build()
    if cpu_build:
        return SyncChoice("reload", adapter, merged, f"reload ({sizes}; on a CPU vLLM, sampling "
                          "through an adapter costs more than the smaller push saves; "
                          "--weight-sync lora opts in)")
    if adapter >= merged:
        return SyncChoice("reload", adapter, merged, f"reload ({sizes}: the adapter is not smaller)")
    return SyncChoice("lora", adapter, merged, f"lora ({sizes}: the adapter alone is pushed)")


__all__ = ["SyncChoice", "VLLM_LORA_RANKS", "choose_weight_sync", "lora_push_bytes", "lora_rank_slot",
           "push_dtype"]
