"""The worker extension's heap release, measured in this process (glibc only)."""

from __future__ import annotations

import ctypes
import ctypes.util
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
