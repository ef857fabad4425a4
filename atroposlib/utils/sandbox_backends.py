"""The sandbox's backends: which work on this host, and the command lines that start a run.

:mod:`atroposlib.utils.sandbox` is the public side (what each backend hides, the run itself);
this module probes ``bwrap`` and ``unshare`` once per process and builds their argv.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass

#: Every backend name, strongest first. ``"none"`` isolates nothing at the OS level.
BACKENDS = ("bwrap", "unshare", "none")
#: The backends that give the run its own network, PID and mount namespaces.
ISOLATING = ("bwrap", "unshare")

#: Top-level system directories the interpreter needs (shared libraries, ``/usr/bin/env``);
#: mounted read-only, or recreated as the same symlink (merged-/usr systems).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: ``pivot_root(2)`` has no libc wrapper; its syscall number per architecture.
NR_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}


@dataclass(frozen=True)
class Probe:
    """What probing one backend found.

    Attributes:
        argv: the wrapper's fixed argv (bwrap: ``[exe]``; unshare: the executable and the
            namespace flags that work here); empty when the backend does not work.
        why_not: why it does not work (missing, or the probe's error); "" when it works.
    """

    argv: tuple[str, ...]
    why_not: str = ""

    @property
    def works(self) -> bool:
        """True when the backend can run programs on this host."""
        return bool(self.argv)


def _probe_run(argv: list[str]) -> str:
    """Run a probe command; "" when it exits 0, else its error in one line."""
    try:
        probe = subprocess.run(argv, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if probe.returncode == 0:
        return ""
    err = probe.stderr.decode(errors="replace").strip().splitlines()
    return f"exit {probe.returncode}: {err[-1] if err else 'no message'}"


#: Why ``unshare`` is not offered to a non-root host (see :func:`probe_unshare`).
UNSHARE_NEEDS_ROOT = (
    "not root: unshare would isolate through a user namespace in which the program is root "
    "with every capability over its own mounts, so it could remount the interpreter's "
    "directories (the env's venv) writable and change them on the host; bubblewrap drops "
    "those capabilities"
)


@functools.lru_cache(maxsize=1)
def probe_unshare() -> Probe:
    """Probe util-linux ``unshare`` once: the namespace flags a run gets here.

    Tries network + IPC + UTS + PID + mount namespaces first, then the same without a mount
    namespace (no private root filesystem then). Only for a root host, whose runs drop to an
    unprivileged uid without capabilities; a non-root host gets :data:`UNSHARE_NEEDS_ROOT`.
    """
    exe = shutil.which("unshare")
    if not sys.platform.startswith("linux"):
        return Probe((), "not Linux")
    if exe is None:
        return Probe((), "`unshare` is not on PATH (util-linux)")
    if os.geteuid() != 0:
        return Probe((), UNSHARE_NEEDS_ROOT)
    base = ["--net", "--ipc", "--uts", "--pid", "--fork", "--kill-child"]
    errors = []
    for extra in (["--mount"], []):
        flags = (exe, *base, *extra)
        error = _probe_run([*flags, "true"])
        if not error:
            return Probe(flags)
        errors.append(f"`{' '.join(flags[1:])} true` failed ({error})")
    return Probe((), "; ".join(errors))


def bwrap_common(network: bool, root: bool) -> list[str]:
    """Namespace and capability flags for bwrap.

    As root, bwrap keeps every capability unless told otherwise: keep only what the bootstrap
    needs to drop to the run's uid. ``--unshare-net`` gives the run a network namespace of its
    own whose only interface is a loopback that is down: no address, the host's 127.0.0.1
    included, can be reached.
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


@functools.lru_cache(maxsize=1)
def probe_bwrap() -> Probe:
    """Probe bubblewrap once, with the namespaces a run uses."""
    exe = shutil.which("bwrap")
    if not sys.platform.startswith("linux"):
        return Probe((), "not Linux")
    if exe is None:
        return Probe((), "`bwrap` is not on PATH (Debian/Ubuntu package `bubblewrap`)")
    error = _probe_run([exe, *bwrap_common(network=False, root=os.geteuid() == 0),
                        "--ro-bind", "/", "/", "--proc", "/proc", "--size", "65536",
                        "--tmpfs", "/tmp", "true"])
    if error:
        return Probe((), f"`bwrap` cannot create its namespaces here ({error})")
    return Probe((exe,))


def probe(backend: str) -> Probe:
    """The probe of ``backend`` (``"none"`` always works)."""
    if backend == "bwrap":
        return probe_bwrap()
    if backend == "unshare":
        return probe_unshare()
    return Probe(("none",))


def clear_probes() -> None:
    """Forget the probes (after installing bubblewrap, or in tests that change ``PATH``)."""
    probe_bwrap.cache_clear()
    probe_unshare.cache_clear()


def interpreter_dirs(python: str) -> list[str]:
    """Directories the interpreter needs to read: its prefix, base prefix and binary dir."""
    dirs = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix),
            os.path.dirname(os.path.realpath(python))}
    return sorted(d for d in dirs if os.path.isdir(d))


def visible_dirs(python: str) -> tuple[list[str], list[str]]:
    """(system directories that exist, interpreter directories outside them) to expose."""
    system = [d for d in SYSTEM_DIRS if os.path.islink(d) or os.path.isdir(d)]
    real_system = [os.path.realpath(d) for d in system if not os.path.islink(d)]
    expose = [d for d in interpreter_dirs(python)
              if not any(d == s or d.startswith(s + "/") for s in real_system)]
    # drop a directory that lies inside another exposed one
    expose = [d for d in expose if not any(d != o and d.startswith(o + "/") for o in expose)]
    return system, expose


def closed_to_others(dirs: list[str], parents: bool) -> str | None:
    """The first of ``dirs`` a stranger uid cannot enter or read, as ``"PATH (mode 0700)"``.

    A root host runs the program under a fresh unprivileged uid, which reads files as "other".

    Args:
        dirs: the interpreter's directories (:func:`interpreter_dirs`).
        parents: also check every parent directory (the ``"none"`` backend sees the host's
            tree; bwrap and unshare recreate the parents world-traversable).

    Returns:
        The offending path and its mode, or None when every one is open to others.
    """
    for top in dirs:
        paths = [top]
        if parents:
            cur = ""
            paths = []
            for comp in top.strip("/").split("/"):
                cur += "/" + comp
                paths.append(cur)
        for path in paths:
            try:
                mode = os.stat(path).st_mode
            except OSError:
                continue
            need = stat.S_IXOTH | (stat.S_IROTH if path == top else 0)
            if mode & need != need:
                return f"{path} (mode {stat.S_IMODE(mode):04o})"
    return None


def bwrap_argv(exe: str, scratch: str, tmpfs_bytes: int, network: bool, python: str,
               root: bool) -> list[str]:
    """The bwrap command line (without the program).

    An empty root with read-only binds of the system and interpreter directories, fresh /dev
    and /proc, private tmpfs /tmp, /var/tmp and /dev/shm of ``tmpfs_bytes`` each, the scratch
    directory read-write, then the root remounted read-only.
    """
    system, expose = visible_dirs(python)
    argv = [exe, *bwrap_common(network, root)]
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

    argv += ["--dev", "/dev", "--proc", "/proc"]
    made.add("/dev")
    size = str(tmpfs_bytes)
    for target in ("/tmp", "/var/tmp", "/dev/shm"):
        argv += [*parents(target), "--perms", "1777", "--size", size, "--tmpfs", target]
        made.add(target)
    # after the private tmpfs mounts: an interpreter installed under /tmp stays visible
    for d in expose:
        argv += [*parents(d), "--ro-bind", d, d]
    # cwd "/": the scratch directory is the run uid's (0700); the bootstrap enters it later
    argv += [*parents(scratch), "--bind", scratch, scratch, "--chdir", "/", "--remount-ro", "/"]
    return argv


# ------------------------------------------------------------------ the run's processes
def kill_uid(uid: int) -> None:
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


def nproc_limit(max_processes: int, private_count: bool) -> int:
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


def terminate(proc: subprocess.Popen) -> None:
    """SIGKILL the run: its init first (so the wrapper reaps it), then the process group.

    A wrapper that has no child yet (the timeout hit before ``unshare``/``bwrap`` forked) is
    killed at once: given time to reap, it would start the program late.
    """
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
        if children:
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


__all__ = [
    "BACKENDS",
    "ISOLATING",
    "NR_PIVOT_ROOT",
    "SYSTEM_DIRS",
    "UNSHARE_NEEDS_ROOT",
    "Probe",
    "bwrap_argv",
    "bwrap_common",
    "clear_probes",
    "closed_to_others",
    "interpreter_dirs",
    "kill_uid",
    "nproc_limit",
    "probe",
    "probe_bwrap",
    "probe_unshare",
    "terminate",
    "visible_dirs",
]
