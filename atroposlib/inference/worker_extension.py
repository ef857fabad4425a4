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

from atroposlib.utils.heap import release_free_heap, resident_bytes

#: The ``--worker-extension-cls`` value VLLMProcess passes to vLLM.
WORKER_EXTENSION_CLS = "atroposlib.inference.worker_extension.AtroposWorkerExtension"
#: The ``/collective_rpc`` method that returns free heap pages to the OS.
RELEASE_FREE_HEAP_RPC = "atropos_release_free_heap"


class AtroposWorkerExtension:
    """Mixed into vLLM's worker class by ``--worker-extension-cls`` (see the module docstring)."""

    def atropos_release_free_heap(self) -> int:
        """Run :func:`release_free_heap` in this worker; return the bytes its RSS shrank by."""
        return release_free_heap()


__all__ = ["RELEASE_FREE_HEAP_RPC", "WORKER_EXTENSION_CLS", "AtroposWorkerExtension", "release_free_heap",
           "resident_bytes"]
