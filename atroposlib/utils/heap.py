"""This process's resident memory, and glibc's free heap pages given back to the OS.

A long-running process that allocates and frees large buffers in a loop (vLLM's hot reload, a
trainer's gradients and weight-sync copies) leaves glibc's malloc holding the freed space
resident: a freed chunk inside the heap is kept for reuse, and the heap shrinks only from its
top. :func:`release_free_heap` returns the whole free pages of every arena with
``malloc_trim(0)``.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any


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
    trim = _malloc_trim()
    if trim is None:
        return 0
    before = resident_bytes()
    trim(0)
    return max(0, before - resident_bytes())


@functools.cache
def _malloc_trim() -> Any:
    """The C library's ``malloc_trim`` (glibc) from the symbols loaded in this process, or None.

    Looked up once (a trainer calls :func:`release_free_heap` after every step), and without
    ``ctypes.util.find_library``, which may run ``ldconfig`` in a subprocess.
    """
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None


__all__ = ["release_free_heap", "resident_bytes"]
