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

Importing this module (vLLM does, in each worker) also quiets one vLLM warning that a partial
reload causes by design: the trainer writes only the tensors it trains, and vLLM's layer-wise
reloader logs ``<Layer>: Failed to load weights`` for every layer absent from those files (about
124 lines a reload on the quickstart), then one line listing every such tensor, although those
layers correctly keep their current weights. :class:`PartialReloadLogFilter` replaces them with
one note per process.
"""

from __future__ import annotations

import logging

from atroposlib.utils.heap import release_free_heap, resident_bytes

#: The ``--worker-extension-cls`` value VLLMProcess passes to vLLM.
WORKER_EXTENSION_CLS = "atroposlib.inference.worker_extension.AtroposWorkerExtension"
#: The ``/collective_rpc`` method that returns free heap pages to the OS.
RELEASE_FREE_HEAP_RPC = "atropos_release_free_heap"


#: vLLM's loggers for the in-place weight reload and its layer-wise processing.
RELOAD_LOGGERS = (
    "vllm.model_executor.model_loader.reload.inplace",
    "vllm.model_executor.model_loader.reload.layerwise",
)
#: vLLM's warning (format string) for each layer that no reloaded file holds.
LAYER_NOT_RELOADED = "%s: Failed to load weights"
#: vLLM's warning (format string) listing every tensor that no reloaded file holds.
TENSORS_NOT_RELOADED = "Following weights were not loaded from checkpoint: %s"
#: What the log says instead, once per process (``%d``: the tensors the first partial reload kept).
PARTIAL_RELOAD_NOTE = (
    "partial weight reload: %d tensors absent from the reloaded files keep their current "
    "weights (vLLM's warnings about such layers and tensors are hidden from here on)"
)


class PartialReloadLogFilter(logging.Filter):
    """Hide vLLM's warnings about tensors a partial reload leaves alone; log one note instead.

    Drops every :data:`LAYER_NOT_RELOADED` record, turns the first
    :data:`TENSORS_NOT_RELOADED` record into an INFO :data:`PARTIAL_RELOAD_NOTE` and drops
    the later ones. Every other record passes unchanged. ``dropped`` counts the records hidden.
    """

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0
        self._noted = False

    def filter(self, record: logging.LogRecord) -> bool:
        """Return False for a hidden record; rewrite the first tensor list into the note."""
        if record.msg == LAYER_NOT_RELOADED:
            self.dropped += 1
            return False
        if record.msg != TENSORS_NOT_RELOADED:
            return True
        if self._noted:
            self.dropped += 1
            return False
        self._noted = True
        kept = record.args[0] if isinstance(record.args, tuple) and record.args else ()
        record.msg, record.args = PARTIAL_RELOAD_NOTE, (len(kept),)
        record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def install_partial_reload_log_filter() -> PartialReloadLogFilter:
    """Add one shared :class:`PartialReloadLogFilter` to vLLM's reload loggers (idempotent)."""
    loggers = [logging.getLogger(name) for name in RELOAD_LOGGERS]
    for existing in loggers[0].filters:
        if isinstance(existing, PartialReloadLogFilter):
            return existing
    installed = PartialReloadLogFilter()
    for logger in loggers:
        logger.addFilter(installed)
    return installed


install_partial_reload_log_filter()


class AtroposWorkerExtension:
    """Mixed into vLLM's worker class by ``--worker-extension-cls`` (see the module docstring)."""

    def atropos_release_free_heap(self) -> int:
        """Run :func:`release_free_heap` in this worker; return the bytes its RSS shrank by."""
        return release_free_heap()


__all__ = ["PARTIAL_RELOAD_NOTE", "RELEASE_FREE_HEAP_RPC", "WORKER_EXTENSION_CLS", "AtroposWorkerExtension",
           "PartialReloadLogFilter", "install_partial_reload_log_filter", "release_free_heap",
           "resident_bytes"]
