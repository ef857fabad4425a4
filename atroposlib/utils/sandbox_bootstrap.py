"""The bootstrap that runs first inside every sandbox run (see :mod:`atroposlib.utils.sandbox`).

It is Python source passed to ``python -I -B -u -c`` with one JSON argument (the run's
configuration). In a fresh, single-threaded interpreter it builds the private root filesystem
(``unshare`` backend only; bubblewrap builds it itself), sets the rlimits, drops to the run's
uid, forks, and in the child installs the audit hook, loads ``runpy``, writes one byte to the
``ready_fd`` pipe (the host's proof that the program itself started) and runs ``main.py``. The
parent (PID 1 of the namespace when there is one) waits and exits with the child's status,
which tears the namespace down.

Exit status 125 before the program starts means the bootstrap refused: it could not build the
private root filesystem, so it did not run the program unconfined.
"""

#: Exit status of the bootstrap when it refuses to run the program (no private root filesystem).
REFUSED_EXIT = 125

BOOTSTRAP = r"""
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
        # after the private tmpfs mounts: an interpreter installed under /tmp stays visible
        for path in cfg["expose"]:
            mkdirs(new + path)
            ro_bind(path, new + path)
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
    os.close(cfg["ready_fd"])
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
# Load what runpy.run_path needs (importlib and pkgutil come from the standard library's
# directory, unlike the frozen modules the bootstrap used so far: an interpreter prefix the
# run's uid cannot read fails here), then tell the host the program starts and close the pipe,
# so the program can neither reach it nor fake a start.
import runpy, pkgutil, importlib.machinery, importlib.util
os.write(cfg["ready_fd"], b"R")
os.close(cfg["ready_fd"])
runpy.run_path("main.py", run_name="__main__")
"""


__all__ = ["BOOTSTRAP", "REFUSED_EXIT"]
