"""What this machine's CPU computes natively, read once from the kernel's CPU flags.

bfloat16 matrix products run natively only on CPUs with the AVX512_BF16 or AMX-BF16
instructions (x86) or the BF16 extension (Arm); elsewhere oneDNN and PyTorch emulate them
through float32 conversions, which is slower than computing in float32 outright. The
quickstart's bf16 settings (``mixed_precision: bf16_if_native``, ``vllm_dtype: bfloat16_if_native``)
ask this module.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

#: CPU flags (``/proc/cpuinfo``) that mean native bfloat16 dot products.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@functools.cache
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags: the ``flags`` (x86) or ``Features`` (Arm) line of ``cpuinfo``.

    Args:
        cpuinfo: the file to read (Linux's ``/proc/cpuinfo``).

    Returns:
        The flags of the first CPU listed, lower-cased; empty where the file is missing or
        has no such line (another OS), so callers fall back to their float32 choice.
    """
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return frozenset(value.lower().split())
    return frozenset()


def native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU computes bfloat16 dot products natively (AVX512_BF16, AMX-BF16, Arm BF16).

    Args:
        cpuinfo: the file to read (Linux's ``/proc/cpuinfo``).

    Returns:
        True when one of :data:`BF16_FLAGS` is present. False where the flags cannot be read.
    """
    return bool(cpu_flags(cpuinfo) & BF16_FLAGS)


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (``model name`` in ``cpuinfo``), else :func:`platform.processor`."""
    try:
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


__all__ = ["BF16_FLAGS", "cpu_flags", "cpu_model", "native_bf16"]
