"""Methods our vLLM servers' workers gain (vLLM's ``--worker-extension-cls``), reached through ``/collective_rpc``.

:class:`~atroposlib.inference.vllm_process.VLLMProcess` starts vLLM with
:data:`WORKER_EXTENSION_CLS` unless its extra arguments name another class. vLLM mixes the class
into its worker, so ``POST /collective_rpc {"method": "atropos_release_free_heap"}`` runs the
method in every worker process (in the engine core when the worker runs there).

Why it exists: a hot reload reads the new tensors into freshly allocated memory, copies them into
the model and frees them, while requests keep allocating around them. glibc's malloc keeps the
freed space resident inside its heap, so without a trim the engine's resident memory grows over a
run. Measured on the quickstart (``benchmarks/bench_learning.py --minutes 2``): after 45 reloads
vLLM's engine held 320 MB of free heap, and its peak RSS fell from 1.73 to 1.59 GiB with a trim
after each reload, with no fewer training steps (a trim takes about 30 ms).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

#: The ``--worker-extension-cls`` value VLLMProcess passes to vLLM.
WORKER_EXTENSION_CLS = "atroposlib.inference.worker_extension.AtroposWorkerExtension"
#: The ``/collective_rpc`` method that returns free heap pages to the OS.
RELEASE_FREE_HEAP_RPC = "atropos_release_free_heap"


def resident_bytes() -> int:
    """This process's resident set size in bytes (``/proc/self/statm``); 0 where it does not exist."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def release_free_heap() -> int:
    """Give the pages of freed heap memory back to the OS with glibc's ``malloc_trim(0)``.

    Live allocations are untouched; only free chunks' whole pages are released (``madvise``), so
    the next allocation that reuses them faults them in again.

    Returns:
        Bytes by which this process's resident set shrank (0 when nothing was released, or where
        the C library is not glibc and has no ``malloc_trim``).
    """
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return 0
    trim = getattr(ctypes.CDLL(libc_name), "malloc_trim", None)
    if trim is None:
        return 0
    before = resident_bytes()
    trim(0)
    return max(0, before - resident_bytes())


class AtroposWorkerExtension:
    """Mixed into vLLM's worker class by ``--worker-extension-cls`` (see the module docstring)."""

    def atropos_release_free_heap(self) -> int:
        """Run :func:`release_free_heap` in this worker; return the bytes its RSS shrank by."""
        return release_free_heap()


__all__ = ["RELEASE_FREE_HEAP_RPC", "WORKER_EXTENSION_CLS", "AtroposWorkerExtension", "release_free_heap",
           "resident_bytes"]
