"""The worker extension's heap release, measured in this process (glibc only)."""

from __future__ import annotations

import ctypes
import ctypes.util
import inspect
import logging
import sys

import pytest

from atroposlib.inference import vllm_process
from atroposlib.inference.vllm_process import VLLMProcess
from atroposlib.inference.worker_extension import (
    WORKER_EXTENSION_CLS,
    AtroposWorkerExtension,
)
from atroposlib.utils.heap import release_free_heap, resident_bytes

CHUNK = 64 * 1024  # under glibc's smallest mmap threshold (128 KiB): these chunks live in the heap
CHUNKS = 2048  # 128 MiB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc are Linux's")
def test_freed_heap_is_resident_until_released():
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    chunks = [libc.malloc(CHUNK) for _ in range(CHUNKS)]
    pin = libc.malloc(CHUNK)  # keeps the freed run below the heap's top (no automatic trim)
    try:
        for address in chunks:
            ctypes.memset(address, 1, CHUNK)
        release_free_heap()
        touched = resident_bytes()
        for address in chunks:
            libc.free(address)
        assert resident_bytes() > touched - CHUNK * CHUNKS // 4, "free() alone gave the pages back"
        released = AtroposWorkerExtension().atropos_release_free_heap()
        assert released > CHUNK * CHUNKS // 2
        assert resident_bytes() < touched - CHUNK * CHUNKS // 2
    finally:
        libc.free(pin)


def test_vllm_runs_the_extension_unless_given_another(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_process, "vllm_is_cpu_build", lambda: True)
    ours = VLLMProcess(tmp_path, port=1)
    cmd = ours.command()
    assert ours.releases_heap and cmd[cmd.index("--worker-extension-cls") + 1] == WORKER_EXTENSION_CLS
    theirs = VLLMProcess(tmp_path, port=1, extra_args=["--worker-extension-cls=my.Ext"])
    assert not theirs.releases_heap and WORKER_EXTENSION_CLS not in theirs.command()


def test_partial_reload_warnings_become_one_note_and_other_records_pass(caplog):
    from vllm.model_executor.model_loader.reload import inplace, layerwise

    from atroposlib.inference.worker_extension import (
        LAYER_NOT_RELOADED,
        PARTIAL_RELOAD_NOTE,
        RELOAD_LOGGERS,
        TENSORS_NOT_RELOADED,
        PartialReloadLogFilter,
        install_partial_reload_log_filter,
    )

    # the loggers and format strings vLLM's reloader really uses
    assert (inplace.logger.name, layerwise.logger.name) == RELOAD_LOGGERS
    assert f'"{LAYER_NOT_RELOADED}"' in inspect.getsource(layerwise)
    assert f'"{TENSORS_NOT_RELOADED}"' in inspect.getsource(inplace)
    in_place, layer_wise = (logging.getLogger(name) for name in RELOAD_LOGGERS)
    installed = install_partial_reload_log_filter()
    assert install_partial_reload_log_filter() is installed
    assert all(sum(isinstance(f, PartialReloadLogFilter) for f in lg.filters) == 1
               for lg in (in_place, layer_wise))
    fresh = PartialReloadLogFilter()
    for lg in (in_place, layer_wise):
        lg.removeFilter(installed)
        lg.addFilter(fresh)
    try:
        with caplog.at_level(logging.DEBUG):
            for _reload in range(2):
                for name in ("LlamaDecoderLayer", "RMSNorm", "VocabParallelEmbedding"):
                    layer_wise.warning(LAYER_NOT_RELOADED, name)
                in_place.warning(TENSORS_NOT_RELOADED, {"a.weight", "b.weight", "c.weight"})
            layer_wise.warning("%s: something else", "RMSNorm")
        texts = [(r.levelname, r.getMessage()) for r in caplog.records if r.name in RELOAD_LOGGERS]
        assert texts == [("INFO", PARTIAL_RELOAD_NOTE % 3), ("WARNING", "RMSNorm: something else")]
        assert fresh.dropped == 7
    finally:
        for lg in (in_place, layer_wise):
            lg.removeFilter(fresh)
            lg.addFilter(installed)
