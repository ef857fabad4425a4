"""Run a server as a child process group: make it die with its launcher, pick a free port."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from typing import Any

#: Signal the launched server gets when the thread that launched it dies (Linux
#: ``PR_SET_PDEATHSIG``). SIGTERM, not SIGKILL: vLLM's API server answers SIGTERM by shutting
#: down its engine core and workers (measured: all gone, port free, within 5 s), whereas a
#: SIGKILLed API server leaves the engine core and its worker (3.4 GB) running as orphans.
PARENT_DEATH_SIGNAL = signal.SIGTERM
#: ``prctl`` option number of ``PR_SET_PDEATHSIG`` (``<linux/prctl.h>``).
_PR_SET_PDEATHSIG = 1


def parent_death_preexec(sig: int = PARENT_DEATH_SIGNAL) -> Any:
    """A ``preexec_fn`` that makes the child receive ``sig`` when its launcher dies (Linux).

    The child calls ``prctl(PR_SET_PDEATHSIG, sig)`` between fork and exec, so the kernel
    signals it when the parent dies for any reason, SIGKILL and OOM kills included, which no
    ``atexit`` hook or signal handler of the parent can cover. If the parent already died
    before the call took effect, the child exits at once instead of running unsupervised.

    Linux ties the signal to the launching *thread*: start the child from a thread that lives
    as long as the child should (the main thread; a worker thread's exit would stop it).

    Args:
        sig: the signal the child receives (default :data:`PARENT_DEATH_SIGNAL`).

    Returns:
        The callable for ``subprocess.Popen(preexec_fn=...)``, or None where ``prctl`` does not
        exist (not Linux): there the child is stopped only by :meth:`VLLMProcess.stop` and the
        atexit hook.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: no dlopen after fork
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died between fork and prctl
            os._exit(1)

    return preexec


def find_free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago (the OS picks it: bind port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


__all__ = ["PARENT_DEATH_SIGNAL", "find_free_port", "parent_death_preexec"]
