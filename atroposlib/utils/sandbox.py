"""Run untrusted Python (model-written code) in a resource-limited, network-less subprocess.

Backends
--------
A run uses one of three backends (:func:`available_backends` lists those that work here):

* ``"bwrap"``: bubblewrap (Debian/Ubuntu package ``bubblewrap``) builds the run's namespaces
  and its root filesystem from explicit binds. The default when it works.
* ``"unshare"`` (root hosts only): util-linux ``unshare`` creates the namespaces, and the
  bootstrap (:mod:`atroposlib.utils.sandbox_bootstrap`) builds the same root filesystem itself
  and moves into it with ``pivot_root``; it refuses to run the program (exit 125, raised as
  :class:`SandboxStartError`) when it cannot. A non-root host is not offered it: there it
  would need a user namespace in which the program is root with every capability over its
  mounts, free to remount the env's venv writable and change it on the host.
* ``"none"``: no namespaces at all; only rlimits, the private uid of a root host and a Python
  audit hook. **It hides nothing of the host** (see below) and is never chosen on its own:
  with neither bwrap nor a working ``unshare``, :func:`resolve_backend` and :func:`run_python`
  raise :class:`SandboxUnavailableError` naming both fixes (install bubblewrap, or pass
  ``backend="none"`` explicitly). An explicit ``"none"`` runs, with one warning per process.

What bwrap and unshare hide
---------------------------
Each run gets fresh **network, IPC, UTS, PID and mount namespaces** (``unshare`` without a mount
namespace, on hosts that refuse one, loses the private root below: :func:`isolation_support`
says so). ``tests/utils/test_sandbox_hostile.py`` runs each case below against each backend,
bypassing the audit hook through child processes and ``ctypes``.

- **Network, loopback included.** The network namespace has one interface, a loopback that is
  down: the host's 127.0.0.1 (run-api and its ``/reset_data``, the inference server, any local
  port), abstract Unix sockets and every other address are unreachable from the program, its
  child processes (``curl``, ``python -c``) and raw ``connect(2)`` calls alike.
- **Files.** The root filesystem is an empty tmpfs holding read-only binds of the system
  directories (``/usr`` and its ``/bin``, ``/lib``... links) and of the interpreter's prefixes
  (venv and base install), a minimal ``/dev``, a fresh ``/proc``, private tmpfs mounts on
  ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (discarded when the run ends, so nothing written
  there persists) and the scratch directory (read-write); the root is read-only. ``/etc``
  (``/etc/passwd`` included), ``/home``, ``/root``, ``/run``, ``/var``, ``/sys``, the project's
  working tree and data sets do not exist inside; when the venv lies inside the working tree
  (or under ``/tmp``), the venv alone is visible at its path.
- **Processes.** The PID namespace's ``/proc`` shows only the run's own processes: host
  command lines (``/proc/1/cmdline`` is the run's own init) and environments are invisible,
  and no host process can be signalled. When the run's init ends, or the wall-clock timeout
  kills it, the kernel kills every process inside, ``setsid()`` escapees included.
- **Users.** On a root host the program runs under a fresh **unprivileged uid** (random, one
  per run, no capabilities), so ``RLIMIT_NPROC`` counts only this run's processes. A non-root
  host runs bwrap with a user namespace, and bwrap drops every capability inside it: the
  program cannot remount anything (``tests/utils/test_sandbox_backends.py`` tries, as
  ``nobody``).

Not hidden by them: the contents of the system directories (installed programs and libraries,
``/usr/local`` included) and the interpreter's directories (read-only); kernel-wide facts in
``/proc`` (``cpuinfo``, ``meminfo``, ``version``, load, uptime), the CPU count, the clock and the
hostname; and the kernel itself (no seccomp filter: the program can make any system call the
kernel allows an unprivileged process). Memory is limited per process (``RLIMIT_AS``), not
per run: a fork bomb of ``max_processes`` processes can use ``max_processes x memory_bytes``;
keep both small, or run the env in a memory cgroup.

What none does and does not do
------------------------------
The program runs in the host's namespaces. The audit hook (PEP 578) refuses, inside the
program's own interpreter only, socket connect/bind/send/resolve and writes outside the scratch
directory; child processes and ``ctypes`` bypass it. Measured by the same tests, the program
**can** read every file its uid can (``/etc/passwd``, the project's files, ``/proc/1/cmdline``
and every host process's command line), leave files in ``/tmp`` and ``/dev/shm``, and reach any
127.0.0.1 port through a child process or ``ctypes`` (it called run-api's ``/reset_data`` and
wiped the queue). On a root host the private uid also means that an interpreter installed under
a directory closed to other users (e.g. ``/root/.pyenv``) cannot start:
:class:`SandboxStartError` says so.

Layers every backend adds
-------------------------
``setrlimit``: ``RLIMIT_CPU`` (CPU seconds; SIGKILL at the limit), ``RLIMIT_AS`` (address
space), ``RLIMIT_FSIZE`` (largest file, stdout/stderr files included), ``RLIMIT_NPROC``
(processes), ``RLIMIT_NOFILE`` and ``RLIMIT_CORE=0``; the audit hook above; a clean environment
(``PATH``, ``HOME``/``TMPDIR`` = scratch, one BLAS thread, no proxies or credentials); an
isolated interpreter (``python -I -B -u``); ``cwd`` = a fresh scratch directory; a wall-clock
timeout after which the whole process group is SIGKILLed; output captured through files capped
by ``RLIMIT_FSIZE`` and read back at most ``max_output_bytes``; the run directory deleted
afterwards.

A run that never reaches the program (bwrap or the bootstrap failed, the interpreter cannot
load its standard library, a limit kills it while it starts) raises :class:`SandboxStartError`:
it is a fault of the host or the configuration, never a result to score. Every result
records the backend that ran it (:attr:`SandboxResult.backend`); each run is logged at DEBUG.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from atroposlib.errors import ConfigError
from atroposlib.utils import sandbox_backends as backends
from atroposlib.utils.sandbox_backends import BACKENDS, ISOLATING
from atroposlib.utils.sandbox_bootstrap import BOOTSTRAP, REFUSED_EXIT

__all__ = [
    "BACKENDS",
    "ISOLATING",
    "NONE_RISK",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "SandboxStartError",
    "SandboxUnavailableError",
    "arun_python",
    "available_backends",
    "isolation_support",
    "resolve_backend",
    "run_python",
    "unavailable_message",
]

logger = logging.getLogger(__name__)

MiB = 1024 * 1024

#: What an explicit ``"none"`` costs, in one sentence (the refusal and the warning say it).
NONE_RISK = (
    "backend 'none' runs model-written code unconfined: it can read every file the env's user "
    "can read (the project, /etc/passwd, other processes' command lines), leave files in /tmp "
    "and /dev/shm, and reach every local port, run-api's /reset_data included; only rlimits "
    "and a Python audit hook that child processes and ctypes bypass apply"
)


class SandboxError(ConfigError):
    """The sandbox cannot run programs as configured on this host.

    A fault of the env or the host, not of the program; the message names the cause and the fix.
    """


class SandboxUnavailableError(SandboxError):
    """No isolating backend works here (or the one named does not); ``"none"`` was not asked for."""


class SandboxStartError(SandboxError):
    """The sandbox did not get as far as starting the program.

    Attributes:
        backend: the backend that was used.
        returncode: the exit status of the run (125: the bootstrap refused to run the program
            without its private root filesystem), or None when it was killed by the timeout.
        stderr: what bwrap, unshare, the bootstrap or the interpreter printed.
    """

    def __init__(self, message: str, *, backend: str, returncode: int | None, stderr: str):
        super().__init__(message)
        self.backend = backend
        self.returncode = returncode
        self.stderr = stderr


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run.

    Attributes:
        cpu_seconds: CPU time per process, seconds (``RLIMIT_CPU``; SIGKILL when reached).
        wall_seconds: wall-clock time of the whole run, seconds; then the group is SIGKILLed.
        memory_bytes: address space per process, bytes (``RLIMIT_AS``); Python needs ~30 MiB
            just to start, numpy ~100 MiB.
        max_processes: processes (and threads) the run may have at once (``RLIMIT_NPROC``).
        file_size_bytes: largest file the run may write, bytes (``RLIMIT_FSIZE``); also caps
            stdout/stderr, which go to files.
        max_open_files: file descriptors per process (``RLIMIT_NOFILE``).
        max_output_bytes: stdout/stderr bytes returned to the caller (each); the rest is
            dropped and ``SandboxResult.truncated`` is set.
        tmpfs_bytes: size of each private tmpfs mounted over /tmp, /var/tmp and /dev/shm.
        network: allow networking (no network namespace, no socket audit); off by default.
    """

    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_bytes: int = 1024 * MiB
    max_processes: int = 16
    file_size_bytes: int = 16 * MiB
    max_open_files: int = 64
    max_output_bytes: int = 1 * MiB
    tmpfs_bytes: int = 16 * MiB
    network: bool = False

    def __post_init__(self):
        for name in ("cpu_seconds", "wall_seconds", "memory_bytes", "max_processes",
                     "file_size_bytes", "max_open_files", "max_output_bytes", "tmpfs_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)}")
        if self.max_processes < 2:
            raise ValueError("SandboxLimits.max_processes must be >= 2 (the run's init + program)")


@dataclass
class SandboxResult:
    """What a sandboxed run did.

    Attributes:
        returncode: exit status; negative ``-N`` when killed by signal N (e.g. -9 after the
            CPU limit).
        stdout: captured standard output (UTF-8, errors replaced), at most
            ``max_output_bytes``.
        stderr: captured standard error, likewise.
        timed_out: the wall-clock limit was hit and the run was killed.
        truncated: stdout or stderr was longer than ``max_output_bytes``.
        duration_s: wall-clock seconds from start to exit.
        isolation: the layers that were active (see :func:`isolation_support`).
        backend: the backend that ran it: ``"bwrap"``, ``"unshare"`` or ``"none"``.
    """

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    duration_s: float
    isolation: list[str] = field(default_factory=list)
    backend: str = ""

    @property
    def ok(self) -> bool:
        """True when the program exited with status 0 within the time limit."""
        return self.returncode == 0 and not self.timed_out


def available_backends() -> list[str]:
    """Sandbox backends that work on this host, strongest first (``"none"`` always works).

    ``"bwrap"``: bubblewrap builds the run's root filesystem from explicit binds.
    ``"unshare"``: util-linux ``unshare`` namespaces; the bootstrap builds the same root itself
    when a mount namespace is available (root hosts only).
    ``"none"``: no namespaces; rlimits, private uid (root host) and the audit hook only; it
    hides nothing (see the module docstring), so :func:`resolve_backend` never picks it.
    """
    return [b for b in BACKENDS if backends.probe(b).works]


_warn_lock = threading.Lock()
_warned_none = False


def _warn_none_once() -> None:
    global _warned_none
    with _warn_lock:
        if _warned_none:
            return
        _warned_none = True
    logger.warning("code sandbox: %s. It was chosen explicitly; install bubblewrap (Debian/"
                   "Ubuntu: apt-get install bubblewrap) to isolate it.", NONE_RISK)


def unavailable_message(asked: str | None = None) -> str:
    """Why no isolating backend (or ``asked``) works here, with both fixes."""
    reasons = "; ".join(f"{b}: {backends.probe(b).why_not}" for b in ISOLATING
                        if asked in (None, "auto", b) and not backends.probe(b).works)
    subject = ("no isolating sandbox backend works on this host" if asked in (None, "auto")
               else f"sandbox backend {asked!r} does not work on this host")
    return (
        f"{subject} ({reasons}), so model-written code will not run. Fix: install "
        "bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; in a container, allow user "
        "namespaces or run it with CAP_SYS_ADMIN), or accept the risk explicitly with "
        "backend='none' (the code_execution env: --env.sandbox none): " + NONE_RISK + "."
    )


def resolve_backend(backend: str | None = None) -> str:
    """The backend a run uses.

    Args:
        backend: ``None`` or ``"auto"``: the strongest isolating backend that works here
            (``"bwrap"``, else ``"unshare"``); ``"bwrap"``/``"unshare"``: that one; ``"none"``:
            no isolation, on explicit request only (logged as a warning once per process).

    Returns:
        ``"bwrap"``, ``"unshare"`` or ``"none"``.

    Raises:
        SandboxUnavailableError: no isolating backend works here (``None``/``"auto"``), or the
            one named does not; the message names the fixes.
        ValueError: ``backend`` is not a backend name.
    """
    if backend in (None, "auto"):
        for name in ISOLATING:
            if backends.probe(name).works:
                return name
        raise SandboxUnavailableError(unavailable_message())
    if backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; use one of {BACKENDS} or 'auto'")
    if backend == "none":
        _warn_none_once()
        return backend
    if not backends.probe(backend).works:
        raise SandboxUnavailableError(unavailable_message(backend))
    return backend


def isolation_support(backend: str | None = None) -> dict[str, bool]:
    """Which isolation layers a backend gives on this host (see the module docstring).

    Args:
        backend: ``"bwrap"``, ``"unshare"``, ``"none"``, or None for the best isolating one
            (as :func:`resolve_backend`).

    Returns:
        ``{"netns", "ipcns", "pidns", "mountns", "rootfs", "uid", "audit", "rlimits"}`` ->
        bool; ``rootfs`` means the private root filesystem (only the interpreter's directories,
        read-only, and the scratch directory; fresh ``/proc``; private ``/tmp``).

    Raises:
        SandboxUnavailableError: ``backend`` does not work here (or none isolating does).
        ValueError: ``backend`` is unknown.
    """
    backend = resolve_backend(backend) if backend != "none" else "none"
    bwrap = backend == "bwrap"
    flags = backends.probe_unshare().argv if backend == "unshare" else ()
    return {
        "netns": bwrap or "--net" in flags,
        "ipcns": bwrap or "--ipc" in flags,
        "pidns": bwrap or "--pid" in flags,
        "mountns": bwrap or "--mount" in flags,
        "rootfs": bwrap or "--mount" in flags,
        "uid": os.geteuid() == 0,
        "audit": True,
        "rlimits": True,
    }


def _clean_env(scratch: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": scratch,
        "TMPDIR": scratch,
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _read_capped(path: Path, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as fh:
        data = fh.read(cap + 1)
    return data[:cap].decode("utf-8", errors="replace"), len(data) > cap


def _start_error(backend: str, returncode: int | None, timed_out: bool, stderr: str,
                 python: str, private_uid: bool, limits: SandboxLimits) -> SandboxStartError:
    """The :class:`SandboxStartError` of a run that never reached the program: cause and fix."""
    tail = "\n".join(stderr.strip().splitlines()[-6:]) or "(no output)"
    status = "timed out" if timed_out else f"exit status {returncode}"
    # this interpreter's prefixes; another one's are unknown here, so check its directory
    dirs = (backends.interpreter_dirs(python) if os.path.realpath(python)
            == os.path.realpath(sys.executable) else [os.path.dirname(os.path.realpath(python))])
    closed = backends.closed_to_others(dirs, parents=backend == "none") if private_uid else None
    if returncode == REFUSED_EXIT and "cannot build the private root" in stderr:
        cause = ("the unshare bootstrap refused to run the program because it could not build "
                 "the private root filesystem. Fix: install bubblewrap (apt-get install "
                 "bubblewrap), or run where mount namespaces are allowed")
    elif closed is not None:
        cause = (f"the interpreter cannot start as the run's unprivileged uid: {closed} is closed "
                 f"to other users, so {python} cannot load its standard library. Fix: make the "
                 "interpreter's directories readable by others (chmod o+rx), use an interpreter "
                 "installed under a world-readable prefix, or use backend 'bwrap' or 'unshare', "
                 "which expose the interpreter's directories")
    elif timed_out:
        cause = (f"the run did not reach the program within wall_seconds={limits.wall_seconds}: "
                 "the host is overloaded or wall_seconds is too small")
    elif any(m in stderr for m in ("MemoryError", "Cannot allocate memory")) or (
            returncode is not None and returncode < 0):
        cause = ("the interpreter was killed or ran out of memory while starting: raise "
                 f"memory_bytes (now {limits.memory_bytes}) or cpu_seconds (now "
                 f"{limits.cpu_seconds})")
    else:
        cause = (f"{backend} or the interpreter {python} failed before the program ran; see "
                 "its output")
    return SandboxStartError(
        f"the code sandbox (backend {backend!r}) could not start the program ({status}): "
        f"{cause}. Its output ends:\n{tail}",
        backend=backend, returncode=None if timed_out else returncode, stderr=stderr)


def run_python(
    code: str,
    *,
    stdin: str | bytes = b"",
    limits: SandboxLimits | None = None,
    files: dict[str, str | bytes] | None = None,
    python: str | None = None,
    backend: str | None = None,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh sandbox (see the module docstring) and wait.

    Blocking; use :func:`arun_python` from async code.

    Args:
        code: Python source, run as ``__main__`` with the scratch directory as cwd.
        stdin: bytes (or text, UTF-8) fed to standard input.
        limits: resource limits; :class:`SandboxLimits` defaults when None.
        files: extra files to place in the scratch directory, ``{relative_name: content}``.
        python: interpreter to run (default: this one, so the venv's packages import).
        backend: as :func:`resolve_backend`: None or ``"auto"`` for the strongest isolating
            backend, ``"bwrap"``, ``"unshare"``, or ``"none"`` (explicit opt-in only).

    Returns:
        A :class:`SandboxResult`. A program that crashes, is killed or times out is a result,
        not an exception.

    Raises:
        SandboxUnavailableError: no isolating backend works here and ``"none"`` was not
            asked for, or the backend named does not work here.
        SandboxStartError: the run never reached the program (see the module docstring).
        ValueError: a name in ``files`` escapes the scratch directory, or ``backend`` is
            unknown.
        OSError: the sandbox itself could not be created (e.g. no temp space).
    """
    limits = limits or SandboxLimits()
    python = python or sys.executable
    backend = resolve_backend(backend)
    support = isolation_support(backend)
    flags: tuple[str, ...] = ()
    if backend == "unshare":
        flags = tuple(f for f in backends.probe_unshare().argv
                      if not (limits.network and f == "--net"))
    run_uid = None
    if os.geteuid() == 0:
        run_uid = secrets.randbelow(1_000_000_000) + 1_000_000_000
    run_dir = Path(os.path.realpath(tempfile.mkdtemp(prefix="atropos-sandbox-")))
    isolation = [name for name, on in support.items() if on and name != "uid"]
    if limits.network:
        isolation = [x for x in isolation if x != "netns"]
    if run_uid is not None:
        isolation.append("uid")
    start = time.monotonic()
    timed_out = False
    ready_r, ready_w = os.pipe()
    try:
        os.chmod(run_dir, 0o711)
        scratch = run_dir / "scratch"
        scratch.mkdir()
        (scratch / "main.py").write_text(code, encoding="utf-8")
        for name, content in (files or {}).items():
            target = (scratch / name).resolve()
            if not target.is_relative_to(scratch.resolve()):
                raise ValueError(f"file name {name!r} escapes the scratch directory; use a "
                                 "relative path without '..'")
            target.parent.mkdir(parents=True, exist_ok=True)
            data = content.encode() if isinstance(content, str) else content
            target.write_bytes(data)
        if run_uid is not None:
            for path in [scratch, *scratch.rglob("*")]:
                os.chown(path, run_uid, run_uid)
        os.chmod(scratch, 0o700)
        stdin_path = run_dir / "stdin"
        stdin_path.write_bytes(stdin.encode() if isinstance(stdin, str) else stdin)
        build_root = "--mount" in flags
        system, expose = backends.visible_dirs(python)
        if build_root:
            (run_dir / "root").mkdir()
        cfg = {
            "scratch": str(scratch),
            "build_root": build_root,
            "new_root": str(run_dir / "root"),
            "system": system,
            "expose": expose,
            "nr_pivot_root": backends.NR_PIVOT_ROOT.get(platform.machine(), 155),
            "tmpfs_bytes": limits.tmpfs_bytes,
            "cpu": int(limits.cpu_seconds),
            "fsize": int(limits.file_size_bytes),
            "nofile": int(limits.max_open_files),
            "nproc": backends.nproc_limit(limits.max_processes, private_count=run_uid is not None
                                  or backend == "bwrap"),
            "mem": int(limits.memory_bytes),
            "uid": run_uid,
            "network": limits.network,
            "ready_fd": ready_w,
        }
        if backend == "bwrap":
            wrapper = backends.bwrap_argv(backends.probe_bwrap().argv[0], str(scratch),
                                          limits.tmpfs_bytes, limits.network, python,
                                          run_uid is not None)
        else:
            wrapper = list(flags)
        argv = [*wrapper, python, "-I", "-B", "-u", "-c", BOOTSTRAP, json.dumps(cfg)]
        with (
            open(stdin_path, "rb") as fin,
            open(run_dir / "stdout", "wb") as fout,
            open(run_dir / "stderr", "wb") as ferr,
        ):
            proc = subprocess.Popen(
                argv,
                stdin=fin,
                stdout=fout,
                stderr=ferr,
                cwd=scratch,
                env=_clean_env(str(scratch)),
                start_new_session=True,
                close_fds=True,
                pass_fds=(ready_w,),
            )
            os.close(ready_w)
            ready_w = -1
            try:
                proc.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                backends.terminate(proc)
        duration = time.monotonic() - start
        os.set_blocking(ready_r, False)
        try:
            started = os.read(ready_r, 1) == b"R"
        except BlockingIOError:
            started = False
        stdout, t1 = _read_capped(run_dir / "stdout", limits.max_output_bytes)
        stderr, t2 = _read_capped(run_dir / "stderr", limits.max_output_bytes)
        returncode = proc.returncode
        if returncode is not None and returncode > 128:
            returncode = 128 - returncode  # the bootstrap reports "killed by signal N" as 128+N
        if not started:
            raise _start_error(backend, returncode, timed_out, stderr, python,
                               run_uid is not None, limits)
        result = SandboxResult(
            returncode=-signal.SIGKILL if timed_out else returncode,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            truncated=t1 or t2,
            duration_s=duration,
            isolation=isolation,
            backend=backend,
        )
        logger.debug("sandbox run: backend=%s returncode=%s timed_out=%s %.2fs", backend,
                     result.returncode, timed_out, duration)
        return result
    finally:
        os.close(ready_r)
        if ready_w != -1:
            os.close(ready_w)
        if run_uid is not None and not support["pidns"]:
            backends.kill_uid(run_uid)
        shutil.rmtree(run_dir, ignore_errors=True)


async def arun_python(code: str, **kwargs) -> SandboxResult:
    """Async :func:`run_python` (runs it in a worker thread); same arguments and result."""
    return await asyncio.to_thread(run_python, code, **kwargs)
