"""Hostile programs against every sandbox backend this host offers, with the host as witness.

One probe program attacks what model-written code could reach on the host: a real run-api (it
calls ``/reset_data``), an HTTP server and an abstract Unix socket on the host's loopback, the
project's files, ``/etc/passwd``, the host's processes, files in the host's ``/tmp``, a SysV
shared-memory segment, and writes that would outlive the run in ``/tmp`` and ``/dev/shm``. It
goes through the Python API, child processes (``python -c``, ``curl``, ``sh``) and ``ctypes``
(which bypass the audit hook). The host then checks what happened (requests received, the
queue's size, files left behind), and every case is compared with what the backend claims
(``atroposlib.utils.sandbox``'s docstring): bwrap and unshare block all of them; ``"none"``
blocks only the Python-level socket.
"""

from __future__ import annotations

import ctypes
import http.server
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import httpx
import pytest

from atroposlib.utils.sandbox import (
    SandboxLimits,
    SandboxStartError,
    available_backends,
    run_python,
)
from tests.api.conftest import REGISTRATION, make_group
from tests.fixtures.api_server import start_run_api

REPO = Path(__file__).resolve().parents[2]
LIMITS = SandboxLimits(cpu_seconds=10, wall_seconds=30)

#: Every attack of the probe program (see the module docstring).
CASES = (
    "read_project", "read_etc_passwd", "host_proc_cmdlines", "read_host_tmp",
    "tmp_write_persists", "dev_shm_write_persists", "sysv_shared_memory",
    "loopback_python_socket", "loopback_child_python", "loopback_child_curl", "loopback_ctypes",
    "abstract_unix_socket", "run_api_reset_data",
)

_PROBE = r'''
import ctypes, json, os, socket, struct, subprocess, sys
T = json.loads(sys.stdin.read())
libc = ctypes.CDLL(None, use_errno=True)
out = {}

def attempt(name, fn):
    try:
        out[name] = fn()
    except BaseException as exc:
        out[name] = "%s: %s" % (type(exc).__name__, exc)

def read(path):
    with open(path, "rb") as fh:
        return fh.read().decode(errors="replace")

def raw_http(port, path):
    # connect(2) and send(2) through libc: no audit event
    s = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
    addr = struct.pack("=HH4s8x", socket.AF_INET, socket.htons(port), socket.inet_aton("127.0.0.1"))
    if libc.connect(s, addr, len(addr)) != 0:
        return "connect errno %d" % ctypes.get_errno()
    req = ("GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" % path).encode()
    libc.send(s, req, len(req), 0)
    buf = ctypes.create_string_buffer(256)
    n = libc.recv(s, buf, 256, 0)
    libc.close(s)
    return buf.raw[:max(n, 0)].decode(errors="replace")

def child(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=10).stdout + "|" + str(os.getpid())

def urlget(url):
    return child("import urllib.request; print(urllib.request.urlopen(%r, timeout=3).read()[:80])" % url)

def curl(url):
    return subprocess.run(["curl", "-s", "-m", "3", url], capture_output=True, text=True,
                          timeout=10).stdout

def write_libc(path):
    fd = libc.open(path.encode(), os.O_WRONLY | os.O_CREAT, 0o644)
    if fd >= 0:
        libc.write(fd, b"pwned", 5)
        libc.close(fd)
    return fd

def shm():
    libc.shmat.restype = ctypes.c_void_p
    shmid = libc.shmget(T["shm_key"], 0, 0)
    if shmid < 0:
        return "shmget errno %d" % ctypes.get_errno()
    addr = libc.shmat(shmid, None, 0o10000)  # SHM_RDONLY
    return ctypes.string_at(addr, len(T["secret"])).decode(errors="replace")

def abstract():
    return child("import socket; s = socket.socket(socket.AF_UNIX); s.connect(%r); "
                 "s.sendall(b'hello'); print('connected')" % ("\0" + T["abstract"]))

http_url = "http://127.0.0.1:%d" % T["http_port"]
api = "http://127.0.0.1:%d/reset_data" % T["api_port"]
attempt("read_project", lambda: read(T["project_file"]))
attempt("read_etc_passwd", lambda: read("/etc/passwd"))
def cmdlines():
    seen = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                seen.append(read("/proc/%s/cmdline" % pid))
            except OSError:
                pass
    return "\n".join(seen) + "\n/proc/1: " + read("/proc/1/cmdline")
attempt("host_proc_cmdlines", cmdlines)
attempt("read_host_tmp", lambda: read(T["host_tmp_file"]))
attempt("tmp_write_persists", lambda: (write_libc("/tmp/" + T["name"] + "-libc"), subprocess.run(
    ["sh", "-c", "echo x > /tmp/%s-sh" % T["name"]], capture_output=True).returncode))
attempt("dev_shm_write_persists", lambda: (write_libc("/dev/shm/" + T["name"] + "-libc"), subprocess.run(
    ["sh", "-c", "echo x > /dev/shm/%s-sh" % T["name"]], capture_output=True).returncode))
attempt("sysv_shared_memory", shm)
def py_socket():
    s = socket.create_connection(("127.0.0.1", T["http_port"]), timeout=3)
    s.sendall(b"GET /python-socket HTTP/1.0\r\n\r\n")
    return s.recv(100).decode(errors="replace")
attempt("loopback_python_socket", py_socket)
attempt("loopback_child_python", lambda: urlget(http_url + "/child-python"))
attempt("loopback_child_curl", lambda: curl(http_url + "/child-curl"))
attempt("loopback_ctypes", lambda: raw_http(T["http_port"], "/ctypes"))
attempt("abstract_unix_socket", abstract)
attempt("run_api_reset_data", lambda: [urlget(api), curl(api), raw_http(T["api_port"], "/reset_data")])
print(json.dumps(out, default=str))
'''


class _Recorder(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.server.paths.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"host says hi")

    def log_message(self, *args):
        pass


class Host:
    """The host side: the things a sandboxed program must not reach, and how to check them."""

    def __init__(self):
        self.secret = f"sk-{uuid.uuid4().hex}"
        self.name = f"atropos-hostile-{uuid.uuid4().hex[:12]}"
        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        self.http.paths = []
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.abstract_hits: list[bytes] = []
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind("\0" + self.name)
        self.unix.listen(4)
        threading.Thread(target=self._accept, daemon=True).start()
        self.api = start_run_api()
        self.secret_proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", f"--api-key={self.secret}"])
        self.host_tmp_file = Path("/tmp") / f"{self.name}-host-secret"
        self.host_tmp_file.write_text(self.secret)
        os.chmod(self.host_tmp_file, 0o644)
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.shmat.restype = ctypes.c_void_p
        self.shm_key = int(uuid.uuid4().int % 2**30) + 1
        self.shm_id = self.libc.shmget(self.shm_key, 4096, 0o1000 | 0o666)  # IPC_CREAT
        assert self.shm_id >= 0, ctypes.get_errno()
        addr = self.libc.shmat(self.shm_id, None, 0)
        ctypes.memmove(addr, self.secret.encode(), len(self.secret))
        self.libc.shmdt(ctypes.c_void_p(addr))

    def _accept(self):
        while True:
            try:
                conn, _ = self.unix.accept()
            except OSError:
                return
            self.abstract_hits.append(conn.recv(16))
            conn.close()

    def reset(self) -> None:
        """A fresh target state: one group queued in run-api, nothing recorded or left."""
        self.http.paths.clear()
        self.abstract_hits.clear()
        httpx.get(self.api.url + "/reset_data", timeout=10).raise_for_status()
        httpx.post(self.api.url + "/register", json=REGISTRATION, timeout=10).raise_for_status()
        httpx.post(self.api.url + "/scored_data", json=make_group(2), timeout=10).raise_for_status()
        assert self.queue_size() == 1
        self.remove_leftovers()

    def queue_size(self) -> int:
        return httpx.get(self.api.url + "/status", timeout=10).json()["queue_size"]

    def leftovers(self, directory: str) -> list[str]:
        return [p for p in (f"{directory}/{self.name}-libc", f"{directory}/{self.name}-sh")
                if os.path.exists(p)]

    def remove_leftovers(self) -> None:
        for directory in ("/tmp", "/dev/shm"):
            for path in self.leftovers(directory):
                os.unlink(path)

    def targets(self) -> dict:
        return {"secret": self.secret, "name": self.name, "http_port": self.http.server_address[1],
                "api_port": self.api.port, "abstract": self.name, "shm_key": self.shm_key,
                "project_file": str(REPO / "pyproject.toml"),
                "host_tmp_file": str(self.host_tmp_file)}

    def reached(self, said: dict[str, str]) -> dict[str, bool]:
        """Per case: did the program get through? From the host's evidence where there is some."""
        paths = self.http.paths
        host_init = Path("/proc/1/cmdline").read_text()
        project = (REPO / "pyproject.toml").read_text()
        return {
            "read_project": said["read_project"] == project,
            "read_etc_passwd": "root:" in said["read_etc_passwd"],
            "host_proc_cmdlines": self.secret in said["host_proc_cmdlines"]
            or said["host_proc_cmdlines"].endswith("/proc/1: " + host_init),
            "read_host_tmp": said["read_host_tmp"] == self.secret,
            "tmp_write_persists": bool(self.leftovers("/tmp")),
            "dev_shm_write_persists": bool(self.leftovers("/dev/shm")),
            "sysv_shared_memory": said["sysv_shared_memory"] == self.secret,
            "loopback_python_socket": "/python-socket" in paths,
            "loopback_child_python": "/child-python" in paths,
            "loopback_child_curl": "/child-curl" in paths,
            "loopback_ctypes": "/ctypes" in paths,
            "abstract_unix_socket": bool(self.abstract_hits),
            "run_api_reset_data": self.queue_size() == 0,
        }

    def close(self) -> None:
        self.remove_leftovers()
        self.secret_proc.kill()
        self.secret_proc.wait()
        self.http.shutdown()
        self.http.server_close()
        self.unix.close()
        self.api.stop()
        self.host_tmp_file.unlink(missing_ok=True)
        self.libc.shmctl(self.shm_id, 0, None)  # IPC_RMID


@pytest.fixture(scope="module")
def host():
    h = Host()
    try:
        yield h
    finally:
        h.close()


def _open_to_others(path: Path) -> bool:
    """True when a uid that is neither owner nor group can read ``path``."""
    for parent in reversed(path.parents):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(path).st_mode & stat.S_IROTH)


def _hidepid() -> bool:
    return any(line.split()[1] == "/proc" and "hidepid" in line
               for line in Path("/proc/mounts").read_text().splitlines())


def expected_reached(backend: str) -> set[str]:
    """The cases a backend lets through, as ``atroposlib.utils.sandbox`` documents."""
    if backend != "none":
        return set()
    # "none": only the audit hook in the program's own interpreter; a root host's private
    # uid reads what "other" may read
    stranger = os.geteuid() == 0
    reached = set(CASES) - {"loopback_python_socket"}
    if stranger and not _open_to_others(REPO / "pyproject.toml"):
        reached.discard("read_project")
    if _hidepid():
        reached.discard("host_proc_cmdlines")
    if shutil.which("curl") is None:
        reached.discard("loopback_child_curl")
    return reached


def interpreter_for(backend: str) -> str:
    """An interpreter the backend can start here.

    ``"none"`` on a root host needs one that other users can read: the env's own may live
    under a directory closed to them, such as ``/root``.
    """
    for python in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if python is None or not os.path.exists(python):
            continue
        try:
            run_python("pass", backend=backend, python=python, limits=LIMITS)
        except SandboxStartError:
            continue
        return python
    pytest.skip(f"no interpreter can start under backend {backend!r} here")


_measured: dict[str, dict[str, bool]] = {}


def measure(host: Host, backend: str) -> dict[str, bool]:
    """Run the probe once per backend; per case, whether it got through."""
    if backend not in available_backends():
        pytest.skip(f"sandbox backend {backend!r} does not work on this host (bwrap: "
                    "apt-get install bubblewrap; unshare: util-linux and namespaces)")
    if backend not in _measured:
        host.reset()
        python = interpreter_for(backend)
        result = run_python(_PROBE, stdin=json.dumps(host.targets()), backend=backend,
                            python=python, limits=LIMITS)
        assert result.ok and result.backend == backend, result.stderr
        said = json.loads(result.stdout)
        _measured[backend] = host.reached(said)
        host.remove_leftovers()
    return _measured[backend]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", ["bwrap", "unshare", "none"])
def test_hostile_case(host, backend, case):
    reached = measure(host, backend)[case]
    claimed = case in expected_reached(backend)
    assert reached == claimed, (
        f"backend {backend!r}: {case} {'got through' if reached else 'was blocked'}, but the "
        f"sandbox's documentation says it is {'not ' if claimed else ''}blocked")
