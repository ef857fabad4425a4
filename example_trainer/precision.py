"""The run's precision where the config leaves it to the hardware (``bf16_if_native``, ``bfloat16_if_native``).

bfloat16 halves the bytes of every matrix product, and runs about twice as fast as float32 where
the hardware computes it natively: CUDA GPUs, and CPUs with AVX512_BF16 or AMX-BF16 (x86) or the
BF16 extension (Arm). Elsewhere PyTorch and oneDNN emulate it through float32 conversions and it
runs slower than float32 outright. ``mixed_precision: bf16_if_native`` and ``vllm_dtype:
bfloat16_if_native`` (the quickstart's settings) pick bf16 only where it is native, so one
config is fast on both kinds of machine. :func:`resolve_precision` turns them into concrete
values once, when the trainer knows its device; ``trainer_config.json`` records the result.
"""

from __future__ import annotations

from typing import Any


def bf16_is_native(device_type: str) -> bool:
    """Whether ``device_type`` (``cuda`` or ``cpu``) computes bfloat16 matrix products natively.

    CUDA: always (every GPU PyTorch supports since Ampere computes bf16; older ones emulate it,
    still faster than their float32 on tensor-core paths, so they count as native here). CPU:
    :func:`atroposlib.utils.cpu_features.native_bf16` (the CPU's flags).
    """
    if device_type == "cuda":
        return True
    from atroposlib.utils.cpu_features import native_bf16

    return native_bf16()


def resolve_precision(config: Any, device_type: str, vllm_on_cpu: bool | None = None) -> Any:
    """``config`` with ``*_if_native`` precision settings made concrete for this machine.

    Args:
        config: the :class:`~example_trainer.config.TrainerConfig`.
        device_type: the trainer's device, ``cuda`` or ``cpu``.
        vllm_on_cpu: whether the vLLM the trainer launches is a CPU build (None: detect it, only
            when ``vllm_dtype`` needs it).

    Returns:
        ``config`` itself when nothing needs resolving, else a copy with ``mixed_precision``
        ``bf16``/``no`` and ``vllm_dtype`` ``bfloat16``/``float32``.
    """
    updates: dict[str, str] = {}
    if config.mixed_precision == "bf16_if_native":
        updates["mixed_precision"] = "bf16" if bf16_is_native(device_type) else "no"
    if config.vllm_dtype == "bfloat16_if_native":
        updates["vllm_dtype"] = vllm_dtype_for(config.vllm_dtype, vllm_on_cpu)
    return config.model_copy(update=updates) if updates else config


def vllm_dtype_for(vllm_dtype: str, vllm_on_cpu: bool | None = None) -> str:
    """The ``--dtype`` to start vLLM with for the ``vllm_dtype`` setting.

    ``bfloat16_if_native`` becomes ``bfloat16`` where the vLLM build's device computes bf16
    natively and ``float32`` elsewhere; every other value is returned as it is.

    Args:
        vllm_dtype: the setting (``auto``, ``float32``, ``bfloat16``, ``float16``,
            ``bfloat16_if_native``).
        vllm_on_cpu: whether the installed vLLM is a CPU build (None: detect it, only when needed).
    """
    if vllm_dtype != "bfloat16_if_native":
        return vllm_dtype
    if vllm_on_cpu is None:
        from atroposlib.inference.vllm_process import vllm_is_cpu_build

        vllm_on_cpu = vllm_is_cpu_build()
    return "bfloat16" if bf16_is_native("cpu" if vllm_on_cpu else "cuda") else "float32"


__all__ = ["bf16_is_native", "resolve_precision", "vllm_dtype_for"]
