"""Run a server as a child process group: die with the launcher, wait for health, stop the whole group, read its log."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

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
        exist (not Linux): there the child is stopped only by
        :meth:`~atroposlib.inference.vllm_process.VLLMProcess.stop` and the atexit hook.
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


def launch_group(cmd: list[str], env: dict[str, str], log_path: Path,
                 die_with_parent: bool = True) -> tuple[subprocess.Popen, IO[bytes]]:
    """Start ``cmd`` as the leader of a new process group, its output appended to ``log_path``.

    The command line is written to the log first (``[atroposlib] $ ...``). The group is its
    own session, so :func:`stop_group` signals only it.

    Args:
        cmd: the argv list.
        env: the complete environment.
        log_path: the log file (its folder is made; the file is appended to).
        die_with_parent: the child gets :data:`PARENT_DEATH_SIGNAL` when the calling thread
            dies (:func:`parent_death_preexec`).

    Returns:
        ``(the process, the open log file)``: close the file once the process is stopped.

    Raises:
        OSError: the log cannot be written or ``cmd`` cannot be started (the log is closed).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = open(log_path, "ab")  # noqa: SIM115 - returned to the caller, who closes it
    try:
        log_file.write(f"\n[atroposlib] $ {' '.join(cmd)}\n".encode())
        log_file.flush()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # own process group: stop_group() signals only this group
            preexec_fn=parent_death_preexec() if die_with_parent else None,
        )
    except BaseException:
        log_file.close()
        raise
    return proc, log_file


def wait_until_healthy(proc: subprocess.Popen, health_url: str, timeout: float,
                       poll_s: float = 0.5) -> int | None:
    """Poll ``GET health_url`` until it answers 200, while ``proc`` runs.

    Args:
        proc: the server process.
        health_url: its health route (``http://HOST:PORT/health``).
        timeout: seconds to wait in all.
        poll_s: seconds between two polls.

    Returns:
        None once healthy; the exit code if the process ended first.

    Raises:
        TimeoutError: not healthy after ``timeout`` seconds (the process is left running).
    """
    import httpx

    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        while True:
            code = proc.poll()
            if code is not None:
                return code
            try:
                if client.get(health_url).status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{health_url} was not healthy after {timeout:.0f} s")
            time.sleep(poll_s)


def stop_group(proc: subprocess.Popen, timeout: float, name: str = "the server") -> None:
    """SIGTERM to ``proc``'s process group, then SIGKILL to what is left after ``timeout`` s.

    ``proc`` must lead its own group (``start_new_session=True``): only that group is
    signalled. Children that outlive the leader (vLLM's engine core, workers) are killed too.
    A leader that ignores SIGTERM for ``timeout`` seconds is logged as ``name``.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            logger.warning("%s (pid %s) ignored SIGTERM for %.0f s; killing", name, proc.pid, timeout)
    # Children (engine core, workers) may outlive the leader; clean the whole group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def read_tail(path: Path, chars: int) -> str:
    """The last ``chars`` characters of the file at ``path`` ("" when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - chars * 2))
            return handle.read().decode(errors="replace")[-chars:]
    except OSError:
        return ""


def describe_exit(code: int) -> str:
    """``exited with code N``, or ``was killed by SIGNAME`` for a negative (signal) code."""
    if code < 0 and -code in signal.valid_signals():
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


__all__ = ["PARENT_DEATH_SIGNAL", "describe_exit", "find_free_port", "launch_group", "parent_death_preexec",
           "read_tail", "stop_group", "wait_until_healthy"]
