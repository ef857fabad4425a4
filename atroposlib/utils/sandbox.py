"""Run untrusted Python (model-written code) in a resource-limited, network-less subprocess.

Layers, outermost first (each one that the host supports; :func:`isolation_support` says which):

1. Namespaces, from the first available backend (:func:`available_backends`):
   **bubblewrap** (``bwrap``, Debian package ``bubblewrap``), else util-linux ``unshare`` (the
   fallback). The run gets fresh **network** (no interfaces but a down loopback: nothing
   reachable), **PID** and **mount** namespaces. The PID namespace makes the run's first
   process its ``init``: when it ends, or when the wall-clock timeout kills it, the kernel
   kills every process inside, including ones that escaped the process group with
   ``setsid()``. As root no user namespace is needed; otherwise one is added.
2. When the host process is **root**, the program runs under a fresh **unprivileged uid**
   (random, unused, one per run): it cannot write anywhere a normal user cannot, cannot signal
   other processes, and ``RLIMIT_NPROC`` counts only this run's processes (root ignores
   ``RLIMIT_NPROC``, and a shared uid would let one run's fork bomb starve another's).
3. In the mount namespace the run gets its own **root filesystem**: an empty tmpfs holding
   read-only binds of the system directories (``/usr`` and its ``/bin``, ``/lib``... links)
   and of the interpreter's prefixes (venv and base install), a minimal ``/dev``, a fresh
   ``/proc`` showing only the run's own processes (no host command lines), small private
   tmpfs mounts on ``/tmp``, ``/var/tmp`` and ``/dev/shm``, and the scratch directory
   read-write at its own path; the root is then read-only. Nothing else of the host (working
   tree, data sets, ``/run``, ``/home``, ``/etc``) exists inside. bwrap builds it from explicit
   binds; with ``unshare`` the bootstrap builds the same tree itself and moves into it with
   ``pivot_root`` (and refuses to run the program, exit 125, if it cannot).
4. ``setrlimit``: ``RLIMIT_CPU`` (CPU seconds; SIGKILL at the limit), ``RLIMIT_AS`` (address
   space), ``RLIMIT_FSIZE`` (largest file, stdout/stderr files included), ``RLIMIT_NPROC``
   (processes), ``RLIMIT_NOFILE`` and ``RLIMIT_CORE=0``.
5. A Python audit hook (PEP 578) refuses socket connect/bind/send/resolve unless networking is
   allowed, and opening files for writing, removing, renaming or creating anything outside the
   scratch directory. It is defence in depth (``ctypes`` can bypass it); it is the only network
   barrier on hosts without ``unshare``.
6. The host side: a clean environment (``PATH``, ``HOME``/``TMPDIR`` = scratch, one BLAS
   thread, no proxies or credentials), an isolated interpreter (``python -I -B -u``: no
   ``PYTHON*`` variables, user site or bytecode writes; unbuffered output, so a killed run
   still shows what it printed), ``cwd`` = a fresh scratch directory,
   ``start_new_session=True``, a wall-clock timeout after which the whole process group is
   SIGKILLed, output captured through files capped by ``RLIMIT_FSIZE`` and read back at most
   ``max_output_bytes``, and the run directory deleted afterwards.

Without ``bwrap`` or ``unshare`` (e.g. an unprivileged container without user namespaces),
layers 1 and 3 are missing: network access is then blocked only at the Python level, and a process that both
``setsid()``s and survives the timeout is cleaned up by uid only when running as root. Run the
env in a container (``--network none``, a pids and memory cgroup) for stronger guarantees.
Memory is limited per process (``RLIMIT_AS``); a fork bomb of ``max_processes`` processes can in
principle use ``max_processes x memory_bytes``: keep both small, or add a memory cgroup.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "arun_python",
    "available_backends",
    "isolation_support",
    "run_python",
]

MiB = 1024 * 1024


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
            CPU limit), None only if the process could not be started.
        stdout: captured standard output (UTF-8, errors replaced), at most
            ``max_output_bytes``.
        stderr: captured standard error, likewise.
        timed_out: the wall-clock limit was hit and the run was killed.
        truncated: stdout or stderr was longer than ``max_output_bytes``.
        duration_s: wall-clock seconds from start to exit.
        isolation: the layers that were active (see :func:`isolation_support`).
    """

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    duration_s: float
    isolation: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the program exited with status 0 within the time limit."""
        return self.returncode == 0 and not self.timed_out


# --------------------------------------------------------------------------------------------
# The bootstrap runs first inside the sandbox (a fresh, single-threaded interpreter): it mounts
# the private tmpfs, sets the rlimits, drops to the run's uid, installs the audit hook, then
# forks: the child runs the program, the parent (PID 1 of the namespace when there is one)
# waits and exits with the child's status, which tears the namespace down.
_BOOTSTRAP = r"""
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1])
scratch = cfg["scratch"]
if cfg["build_root"]:
    # The fallback backend builds the run's root filesystem itself (as bubblewrap does): a
    # fresh tmpfs holding read-only binds of the system and interpreter directories, private
    # tmpfs /tmp, /var/tmp and /dev/shm, the scratch directory, a minimal /dev and a /proc of
    # the run's PID namespace; then pivot_root into it and detach the host's tree.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
        MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
        def mount(src, dst, fstype, flags, data=None):
            enc = lambda x: None if x is None else x.encode()
            if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
                err = ctypes.get_errno()
                raise OSError(err, "mount %s on %s: %s" % (src, dst, os.strerror(err)))
        def ro_bind(src, dst):
            mount(src, dst, None, MS_BIND | MS_REC)
            kept = os.statvfs(dst).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048)
            mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | kept)
        def mkdirs(path, mode=0o755):
            cur = ""
            for comp in path.strip("/").split("/"):
                cur += "/" + comp
                if not os.path.isdir(cur):
                    os.mkdir(cur)
                    os.chmod(cur, mode)
        new = cfg["new_root"]
        mount("none", "/", None, MS_REC | MS_PRIVATE)
        mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        for top in cfg["system"]:
            if os.path.islink(top):
                os.symlink(os.readlink(top), new + top)
            else:
                mkdirs(new + top)
                ro_bind(top, new + top)
        for path in cfg["expose"]:
            mkdirs(new + path)
            ro_bind(path, new + path)
        mkdirs(new + "/dev")
        mount("tmpfs", new + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
        for name in ("null", "zero", "full", "random", "urandom", "tty"):
            if os.path.exists("/dev/" + name):
                open(new + "/dev/" + name, "w").close()
                mount("/dev/" + name, new + "/dev/" + name, None, MS_BIND)
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                             ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
            os.symlink(target, new + "/dev/" + name)
        tmp_opts = "size=%d,mode=1777" % cfg["tmpfs_bytes"]
        for target in ("/tmp", "/var/tmp", "/dev/shm"):
            mkdirs(new + target)
            mount("tmpfs", new + target, "tmpfs", MS_NOSUID | MS_NODEV, tmp_opts)
        mkdirs(new + scratch)
        mount(scratch, new + scratch, None, MS_BIND)
        mkdirs(new + "/proc")
        mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        os.chdir(new)
        if libc.syscall(cfg["nr_pivot_root"], b".", b".") != 0:
            raise OSError(ctypes.get_errno(), "pivot_root")
        if libc.umount2(b".", 2) != 0:  # MNT_DETACH: the host's tree is gone from this namespace
            raise OSError(ctypes.get_errno(), "detach the host root")
        os.chdir("/")
        mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    except OSError as exc:
        sys.stderr.write("sandbox: cannot build the private root filesystem (%s); refusing to "
                         "run the program\n" % (exc,))
        sys.stderr.flush()
        os._exit(125)
R = resource
R.setrlimit(R.RLIMIT_CORE, (0, 0))
R.setrlimit(R.RLIMIT_CPU, (cfg["cpu"], cfg["cpu"]))
R.setrlimit(R.RLIMIT_FSIZE, (cfg["fsize"], cfg["fsize"]))
R.setrlimit(R.RLIMIT_NOFILE, (cfg["nofile"], cfg["nofile"]))
R.setrlimit(R.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))
if cfg["uid"] is not None:
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])
os.chdir(scratch)
R.setrlimit(R.RLIMIT_AS, (cfg["mem"], cfg["mem"]))
pid = os.fork()
if pid:
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(128 - code if code < 0 else code)
def _install(scratch, allow_net):
    import os as _os
    import sys as _sys
    root = _os.path.realpath(scratch)
    write_flags = _os.O_WRONLY | _os.O_RDWR | _os.O_CREAT | _os.O_TRUNC | _os.O_APPEND
    ok_paths = ("/dev/null", "/dev/stdout", "/dev/stderr")
    def inside(path):
        if isinstance(path, int):
            return True
        path = _os.fsdecode(path)
        if path in ok_paths:
            return True
        full = _os.path.realpath(_os.path.join(root, path))
        return full == root or full.startswith(root + _os.sep)
    path_events = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                   "os.symlink", "os.link", "os.truncate", "shutil.rmtree", "os.utime",
                   "shutil.copyfile", "shutil.move", "os.replace"}
    net_events = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
                  "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr"}
    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags)
            if writing and path is not None and not inside(path):
                raise PermissionError("sandbox: writing outside the scratch directory is not "
                                      "allowed: %r" % (path,))
        elif event in path_events:
            for path in args[:2] if event in ("os.rename", "os.replace", "os.link",
                                               "shutil.copyfile", "shutil.move",
                                               "os.symlink") else args[:1]:
                if isinstance(path, (str, bytes)) and not inside(path):
                    raise PermissionError("sandbox: %s outside the scratch directory is not "
                                          "allowed: %r" % (event, path))
        elif not allow_net and event in net_events:
            raise PermissionError("sandbox: network access is disabled (%s)" % event)
    _sys.addaudithook(hook)
_install(scratch, cfg["network"])
del _install
sys.argv = ["main.py"]
import runpy
runpy.run_path("main.py", run_name="__main__")
"""


#: Top-level system directories the interpreter needs (shared libraries, ``/usr/bin/env``);
#: mounted read-only, or recreated as the same symlink (merged-/usr systems).
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: ``pivot_root(2)`` has no libc wrapper; its syscall number per architecture.
_NR_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}

BACKENDS = ("bwrap", "unshare", "none")


@functools.lru_cache(maxsize=1)
def _unshare_flags() -> tuple[str, ...]:
    """The ``unshare`` flags that work on this host (probed once), or () when none do."""
    exe = shutil.which("unshare")
    if exe is None or not sys.platform.startswith("linux"):
        return ()
    base = ["--net", "--pid", "--fork", "--kill-child"]
    if os.geteuid() != 0:
        base.insert(0, "--map-root-user")
    for extra in (["--mount"], []):
        flags = (exe, *base, *extra)
        try:
            probe = subprocess.run([*flags, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return flags
    return ()


@functools.lru_cache(maxsize=1)
def _bwrap_exe() -> str | None:
    """Path of a working ``bwrap`` (probed once with the namespaces a run uses), else None."""
    exe = shutil.which("bwrap")
    if exe is None or not sys.platform.startswith("linux"):
        return None
    probe_argv = [exe, *_bwrap_common(network=False, root=os.geteuid() == 0),
                  "--ro-bind", "/", "/", "--proc", "/proc", "--size", "65536", "--tmpfs", "/tmp",
                  "true"]
    try:
        probe = subprocess.run(probe_argv, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return exe if probe.returncode == 0 else None


def available_backends() -> list[str]:
    """Sandbox backends that work on this host, strongest first (``"none"`` always works).

    ``"bwrap"``: bubblewrap builds the run's root filesystem from explicit binds.
    ``"unshare"``: util-linux ``unshare`` namespaces; the bootstrap builds the same root itself
    when a mount namespace is available (root, or unprivileged user namespaces).
    ``"none"``: no namespaces; rlimits, private uid (root host) and the audit hook only.
    """
    out = []
    if _bwrap_exe() is not None:
        out.append("bwrap")
    if _unshare_flags():
        out.append("unshare")
    out.append("none")
    return out


def _pick_backend(backend: str | None) -> str:
    if backend is None:
        return available_backends()[0]
    if backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r}; use one of {BACKENDS} or None")
    if backend not in available_backends():
        raise ValueError(f"sandbox backend {backend!r} does not work on this host (available: "
                         f"{available_backends()}); install bubblewrap (Debian: apt-get install "
                         "bubblewrap) or pass backend=None to pick the best available")
    return backend


def isolation_support(backend: str | None = None) -> dict[str, bool]:
    """Which isolation layers a backend gives on this host (see the module docstring).

    Args:
        backend: ``"bwrap"``, ``"unshare"``, ``"none"``, or None for the best available.

    Returns:
        ``{"netns", "pidns", "mountns", "rootfs", "uid", "audit", "rlimits"}`` -> bool;
        ``rootfs`` means the private root filesystem (only the interpreter's directories,
        read-only, and the scratch directory; fresh ``/proc``; private ``/tmp``).

    Raises:
        ValueError: ``backend`` is unknown or does not work on this host.
    """
    backend = _pick_backend(backend)
    bwrap = backend == "bwrap"
    flags = _unshare_flags() if backend == "unshare" else ()
    return {
        "netns": bwrap or "--net" in flags,
        "pidns": bwrap or "--pid" in flags,
        "mountns": bwrap or "--mount" in flags,
        "rootfs": bwrap or "--mount" in flags,
        "uid": os.geteuid() == 0,
        "audit": True,
        "rlimits": True,
    }


def _bwrap_common(network: bool, root: bool) -> list[str]:
    """Namespace and capability flags for bwrap.

    As root, bwrap keeps every capability unless told otherwise: keep only what the bootstrap
    needs to drop to the run's uid.
    """
    argv = ["--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try"]
    if not network:
        argv.append("--unshare-net")
    if root:
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv.append("--unshare-user")
    return argv


def _visible_dirs(python: str) -> tuple[list[str], list[str]]:
    """(system directories that exist, interpreter directories outside them) to expose."""
    system = [d for d in _SYSTEM_DIRS if os.path.islink(d) or os.path.isdir(d)]
    real_system = [os.path.realpath(d) for d in system if not os.path.islink(d)]
    expose = [d for d in _interpreter_dirs(python)
              if not any(d == s or d.startswith(s + "/") for s in real_system)]
    # drop a directory that lies inside another exposed one
    expose = [d for d in expose if not any(d != o and d.startswith(o + "/") for o in expose)]
    return system, expose


def _bwrap_argv(exe: str, scratch: str, limits: SandboxLimits, python: str,
                root: bool) -> list[str]:
    """The bwrap command line (without the program).

    An empty root with read-only binds of the system and interpreter directories, fresh /dev
    and /proc, private tmpfs /tmp, /var/tmp and /dev/shm, the scratch directory read-write,
    then the root remounted read-only.
    """
    system, expose = _visible_dirs(python)
    argv = [exe, *_bwrap_common(limits.network, root)]
    for d in system:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        else:
            argv += ["--ro-bind", d, d]
    made: set[str] = set()

    def parents(path: str) -> list[str]:
        # bwrap creates missing parents 0700: make them traversable for the run's uid
        out, cur = [], ""
        for comp in path.strip("/").split("/")[:-1]:
            cur += "/" + comp
            if cur not in made:
                made.add(cur)
                out += ["--perms", "0755", "--dir", cur]
        return out

    for d in expose:
        argv += [*parents(d), "--ro-bind", d, d]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    made.add("/dev")
    size = str(limits.tmpfs_bytes)
    for target in ("/tmp", "/var/tmp", "/dev/shm"):
        argv += [*parents(target), "--perms", "1777", "--size", size, "--tmpfs", target]
        made.add(target)
    # cwd "/": the scratch directory is the run uid's (0700); the bootstrap enters it later
    argv += [*parents(scratch), "--bind", scratch, scratch, "--chdir", "/", "--remount-ro", "/"]
    return argv


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


def _kill_uid(uid: int) -> None:
    """SIGKILL every process owned by ``uid`` (a run's private uid), until none is left."""
    import psutil

    for _ in range(50):
        victims = []
        for proc in psutil.process_iter(["uids"]):
            uids = proc.info.get("uids")
            if uids is not None and uid in (uids.real, uids.effective):
                victims.append(proc)
        if not victims:
            return
        for proc in victims:
            try:
                proc.kill()
            except psutil.Error:
                pass
        time.sleep(0.02)


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
        backend: ``"bwrap"``, ``"unshare"`` or ``"none"`` (see :func:`available_backends`);
            None picks the strongest one this host supports.

    Returns:
        A :class:`SandboxResult`. A program that crashes, is killed or times out is a result,
        not an exception.

    Raises:
        ValueError: a name in ``files`` escapes the scratch directory, or ``backend`` is
            unknown or unavailable here.
        OSError: the sandbox itself could not be created (e.g. no temp space).
    """
    limits = limits or SandboxLimits()
    python = python or sys.executable
    backend = _pick_backend(backend)
    support = isolation_support(backend)
    flags: tuple[str, ...] = ()
    if backend == "unshare":
        flags = tuple(f for f in _unshare_flags() if not (limits.network and f == "--net"))
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
    proc = None
    timed_out = False
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
        system, expose = _visible_dirs(python)
        if build_root:
            (run_dir / "root").mkdir()
        cfg = {
            "scratch": str(scratch),
            "build_root": build_root,
            "new_root": str(run_dir / "root"),
            "system": system,
            "expose": expose,
            "nr_pivot_root": _NR_PIVOT_ROOT.get(platform.machine(), 155),
            "tmpfs_bytes": limits.tmpfs_bytes,
            "cpu": int(limits.cpu_seconds),
            "fsize": int(limits.file_size_bytes),
            "nofile": int(limits.max_open_files),
            "nproc": _nproc_limit(limits.max_processes, private_count=run_uid is not None
                                  or "--map-root-user" in flags or backend == "bwrap"),
            "mem": int(limits.memory_bytes),
            "uid": run_uid,
            "network": limits.network,
        }
        if backend == "bwrap":
            wrapper = _bwrap_argv(_bwrap_exe(), str(scratch), limits, python, run_uid is not None)
        else:
            wrapper = list(flags)
        argv = [*wrapper, python, "-I", "-B", "-u", "-c", _BOOTSTRAP, json.dumps(cfg)]
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
            )
            try:
                proc.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _terminate(proc)
        duration = time.monotonic() - start
        stdout, t1 = _read_capped(run_dir / "stdout", limits.max_output_bytes)
        stderr, t2 = _read_capped(run_dir / "stderr", limits.max_output_bytes)
        returncode = proc.returncode
        if returncode is not None and returncode > 128:
            returncode = 128 - returncode  # the bootstrap reports "killed by signal N" as 128+N
        return SandboxResult(
            returncode=-signal.SIGKILL if timed_out else returncode,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            truncated=t1 or t2,
            duration_s=duration,
            isolation=isolation,
        )
    finally:
        if run_uid is not None and not support["pidns"]:
            _kill_uid(run_uid)
        shutil.rmtree(run_dir, ignore_errors=True)


def _nproc_limit(max_processes: int, private_count: bool) -> int:
    """RLIMIT_NPROC value giving the run ``max_processes`` of its own.

    The kernel counts every process of the real uid. A private uid (root host) or a private
    user namespace (``private_count``) counts only the run's; otherwise add the processes this
    user already has.
    """
    if private_count:
        return max_processes
    import psutil

    uid = os.getuid()
    mine = sum(1 for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid)
    return mine + max_processes


def _interpreter_dirs(python: str) -> list[str]:
    """Directories the interpreter needs to read: its prefix, base prefix and binary dir."""
    dirs = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix),
            os.path.dirname(os.path.realpath(python))}
    return sorted(d for d in dirs if os.path.isdir(d))


def _terminate(proc: subprocess.Popen) -> None:
    """SIGKILL the run: its init first (so ``unshare`` reaps it), then the process group."""
    if proc.poll() is None:
        import psutil

        try:
            children = psutil.Process(proc.pid).children()
        except psutil.Error:
            children = []
        for child in children:
            try:
                child.kill()
            except psutil.Error:
                pass
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


async def arun_python(code: str, **kwargs) -> SandboxResult:
    """Async :func:`run_python` (runs it in a worker thread); same arguments and result."""
    return await asyncio.to_thread(run_python, code, **kwargs)
