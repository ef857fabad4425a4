"""Tests of the code-execution sandbox: normal runs and hostile programs (atroposlib.utils.sandbox)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from atroposlib.utils.sandbox import (
    SandboxLimits,
    SandboxResult,
    arun_python,
    available_backends,
    isolation_support,
    run_python,
)

FAST = SandboxLimits(cpu_seconds=2, wall_seconds=4)
# The private uids a root host gives runs (see sandbox.run_python).
RUN_UID_MIN = 1_000_000_000


@dataclass
class Sandbox:
    """One backend under test: its isolation layers and a ``run_python`` bound to it."""

    backend: str
    support: dict[str, bool]

    def run(self, code: str, **kwargs) -> SandboxResult:
        return run_python(code, backend=self.backend, **kwargs)


@pytest.fixture(params=["bwrap", "unshare"])
def sandbox(request) -> Sandbox:
    """Every behaviour test runs on both backends: bubblewrap and the unshare fallback."""
    if request.param not in available_backends():
        pytest.skip(f"sandbox backend {request.param!r} does not work on this host "
                    "(bwrap: apt-get install bubblewrap; unshare: util-linux, namespaces)")
    return Sandbox(request.param, isolation_support(request.param))


def _run_uid_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["uids"]):
        uids = p.info["uids"]
        if uids is not None and uids.real >= RUN_UID_MIN:
            out.append(p)
    return out


def _libc_prelude() -> str:
    # Hostile programs use libc through ctypes to bypass the Python-level audit hook, so the
    # tests exercise the OS-level barriers.
    return "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def test_normal_program_stdin_files_and_exit_code(sandbox):
    code = (
        "import sys, json\n"
        "data = sys.stdin.read()\n"
        "extra = open('data/in.txt').read()\n"
        "open('out.txt', 'w').write('scratch is writable')\n"
        "print(json.dumps([data, extra, open('out.txt').read()]))\n"
        "sys.exit(7)\n"
    )
    r = sandbox.run(code, stdin="hello", files={"data/in.txt": "extra"}, limits=FAST)
    assert r.returncode == 7 and not r.timed_out and not r.ok
    assert r.stdout.strip() == '["hello", "extra", "scratch is writable"]'
    ok = sandbox.run("print(sum(range(10)))", limits=FAST)
    assert ok.ok and ok.stdout == "45\n"


def test_exception_is_a_result_with_traceback(sandbox):
    r = sandbox.run("def f():\n    raise ValueError('nope')\nf()", limits=FAST)
    assert r.returncode == 1 and "ValueError: nope" in r.stderr


def test_files_cannot_escape_scratch():
    with pytest.raises(ValueError, match="escapes the scratch"):
        run_python("pass", files={"../x.py": "1"})


def test_limits_are_validated():
    with pytest.raises(ValueError, match="cpu_seconds must be > 0"):
        SandboxLimits(cpu_seconds=0)
    with pytest.raises(ValueError, match="max_processes must be >= 2"):
        SandboxLimits(max_processes=1)


def test_infinite_loop_killed_by_cpu_limit(sandbox):
    start = time.monotonic()
    r = sandbox.run("while True:\n    pass\n", limits=SandboxLimits(cpu_seconds=1, wall_seconds=20))
    assert r.returncode == -9 and not r.timed_out
    assert time.monotonic() - start < 15


def test_sleeping_program_killed_by_wall_clock(sandbox):
    r = sandbox.run("import time\nprint('started')\ntime.sleep(60)\n", limits=SandboxLimits(wall_seconds=1))
    assert r.timed_out and r.returncode == -9 and not r.ok
    assert r.duration_s < 5
    assert r.stdout == "started\n"  # unbuffered: output before the kill is kept


def test_huge_allocation_fails_inside_the_sandbox(sandbox):
    r = sandbox.run("x = bytearray(20 * 1024**3)\nprint('allocated')",
                   limits=SandboxLimits(memory_bytes=256 * 1024**2, wall_seconds=10))
    assert "MemoryError" in r.stderr and "allocated" not in r.stdout
    # a ctypes malloc is bounded by RLIMIT_AS too
    r = sandbox.run(_libc_prelude() + "libc.malloc.restype = ctypes.c_void_p\n"
                   "print(libc.malloc(ctypes.c_size_t(20 * 1024**3)))",
                   limits=SandboxLimits(memory_bytes=256 * 1024**2))
    assert r.stdout.strip() == "None"


def test_fork_bomb_is_bounded_and_cleaned_up(sandbox):
    before_pids = len(psutil.pids())
    bomb = (
        "import os, time\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        time.sleep(0.01)\n"
    )
    start = time.monotonic()
    r = sandbox.run(bomb, limits=SandboxLimits(max_processes=16, wall_seconds=3, cpu_seconds=10))
    assert r.timed_out and time.monotonic() - start < 15
    time.sleep(0.5)
    # the host still works: it can start processes, and nothing of the bomb is left
    assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True).stdout == b"1\n"
    if sandbox.support["uid"]:
        assert _run_uid_processes() == []
    assert len(psutil.pids()) < before_pids + 10


def test_fork_bomb_never_exceeds_the_process_limit(sandbox):
    # Each process that fork()s successfully prints once; the count can never pass the limit.
    code = (
        "import os, sys, time\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            print('child', flush=True)\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "    except OSError:\n"
        "        print('refused', flush=True)\n"
        "        break\n"
        "os._exit(0)\n"
    )
    r = sandbox.run(code, limits=SandboxLimits(max_processes=8, wall_seconds=5))
    children = r.stdout.count("child")
    assert "refused" in r.stdout and 1 <= children <= 8


def test_setsid_daemon_does_not_outlive_the_run(sandbox):
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(120)\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\n"
        "print('parent done')\n"
    )
    r = sandbox.run(code, limits=FAST)
    assert r.ok and "parent done" in r.stdout
    time.sleep(0.3)
    if sandbox.support["uid"]:
        assert _run_uid_processes() == []


def test_writes_outside_scratch_are_blocked(sandbox, tmp_path):
    target = tmp_path / "escape.txt"
    shared = tmp_path / "world_writable"
    shared.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(shared, 0o777)
    py = sandbox.run(f"open({str(target)!r}, 'w').write('x')", limits=FAST)
    assert py.returncode == 1 and "outside the scratch directory" in py.stderr
    if not (sandbox.support["mountns"] or sandbox.support["uid"]):
        pytest.skip("no OS-level write barrier here (no mount namespace, not root): only the "
                    "audit hook applies, checked above")
    # bypass the Python audit hook with libc: the OS layers (uid, private /tmp) still stop it
    for path in (target, shared / "escape.txt", "/dev/shm/atropos-escape-test"):
        code = _libc_prelude() + (
            f"fd = libc.open({str(path).encode()!r}, os.O_WRONLY | os.O_CREAT, 0o644)\n"
            "if fd >= 0:\n"
            "    libc.write(fd, b'pwned', 5)\n"
            "print('fd', fd)\n"
        )
        sandbox.run(code, limits=FAST)
        assert not os.path.exists(path), path
    assert sorted(os.listdir(shared)) == []


def _tree_and_file_probe(paths: list[str], dirs: list[str]) -> str:
    # libc-free: reading is not audited, so this tests the filesystem view itself
    return (
        "import json, os\n"
        "out = {}\n"
        f"for p in {paths!r}:\n"
        "    try:\n"
        "        out[p] = open(p).read()\n"
        "    except OSError as exc:\n"
        "        out[p] = type(exc).__name__\n"
        f"for d in {dirs!r}:\n"
        "    try:\n"
        "        out[d] = sorted(os.listdir(d))\n"
        "    except OSError as exc:\n"
        "        out[d] = type(exc).__name__\n"
        "print(json.dumps(out))\n"
    )


def test_world_writable_host_paths_are_private_or_read_only(sandbox):
    # Writes through libc (no audit hook): /run/lock and friends are world-writable on the host.
    name = f"atropos-escape-{uuid.uuid4().hex}"
    targets = [f"/run/lock/{name}", f"/tmp/{name}", f"/dev/shm/{name}", f"/var/tmp/{name}",
               f"/{name}", f"/usr/{name}", f"/var/{name}"]
    code = _libc_prelude() + (
        f"for path in {targets!r}:\n"
        "    fd = libc.open(path.encode(), os.O_WRONLY | os.O_CREAT, 0o644)\n"
        "    if fd >= 0:\n"
        "        libc.write(fd, b'pwned', 5)\n"
        "    print(path, fd)\n"
    )
    r = sandbox.run(code, limits=FAST)
    assert r.ok, r.stderr
    opened = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())
    assert set(opened) == set(targets)
    for path in targets:
        assert not os.path.exists(path), f"sandboxed code wrote {path} on the host"
    # /run does not exist inside; /, /usr, /var are read-only; the tmpfs ones are private
    for path in (f"/run/lock/{name}", f"/{name}", f"/usr/{name}", f"/var/{name}"):
        assert opened[path] == "-1", path
    assert opened[f"/tmp/{name}"] != "-1"  # writable, but a private tmpfs


def test_host_processes_are_invisible(sandbox):
    # A host process with a secret in its argv: readable in the host's /proc, not inside.
    secret = f"--api-key=sk-{uuid.uuid4().hex}"
    host = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); "
                             "time.sleep(60)", secret], stdout=subprocess.PIPE)
    try:
        assert host.stdout.readline() == b"up\n"
        assert secret in psutil.Process(host.pid).cmdline()
        code = (
            "import os\n"
            "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
            "print('pids', len(pids))\n"
            "for p in pids:\n"
            "    try:\n"
            "        print(p, open(f'/proc/{p}/cmdline').read().replace('\\0', ' ')[:300])\n"
            "    except OSError as exc:\n"
            "        print(p, type(exc).__name__)\n"
            f"for p in ('/proc/1/cmdline', '/proc/{host.pid}/cmdline', '/proc/{os.getpid()}/environ'):\n"
            "    try:\n"
            "        print(p, open(p).read().replace('\\0', ' '))\n"
            "    except OSError as exc:\n"
            "        print(p, type(exc).__name__)\n"
        )
        r = sandbox.run(code, limits=FAST)
    finally:
        host.kill()
        host.wait()
        host.stdout.close()
    assert r.ok, r.stderr
    assert secret not in r.stdout
    assert "PYTHONPATH" not in r.stdout and "sleep(60)" not in r.stdout
    # a fresh /proc: only the run's own few processes (init, bootstrap, program)
    count = int(r.stdout.split("\n", 1)[0].split()[1])
    assert 1 <= count <= 4, r.stdout


def test_working_tree_and_host_files_are_absent(sandbox, tmp_path):
    # Reward hacking: the program must not read the data set's answers or the repository.
    repo = Path(__file__).resolve().parents[2]
    answers = tmp_path / "gsm8k_test.jsonl"
    secret = f"#### {uuid.uuid4().hex}"  # not "42": pytest's tmp path can hold pytest-42
    answers.write_text(json.dumps({"answer": secret}) + "\n")
    os.chmod(tmp_path, 0o755)
    os.chmod(answers, 0o644)
    outside = [str(answers), str(repo / "pyproject.toml"), str(Path(__file__).resolve()),
               "/etc/hostname", "/etc/passwd"]
    r = sandbox.run(_tree_and_file_probe(outside, [str(repo), "/", "/etc", "/home", "/run"]),
                    limits=FAST)
    assert r.ok, r.stderr
    seen = json.loads(r.stdout)
    for path in outside:
        assert seen[path] == "FileNotFoundError", (path, seen[path])
    for path in ("/etc", "/home", "/run"):
        assert seen[path] == "FileNotFoundError", (path, seen[path])
    # the repository directory exists inside only as a path to the interpreter (e.g. .venv)
    needed = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix)}
    allowed = {c.name for c in repo.iterdir() if any(n == c or c in n.parents for n in needed)}
    if seen[str(repo)] != "FileNotFoundError":
        assert set(seen[str(repo)]) <= allowed, seen[str(repo)]
    assert secret.split()[1] not in r.stdout
    root = set(seen["/"])
    assert not root & {"etc", "home", "run", "root" if not any(
        "/root/" in str(n) for n in needed) else "", "boot", "srv", "opt", "mnt"} - {""}, root


def test_output_is_capped(sandbox):
    limits = SandboxLimits(max_output_bytes=1000, file_size_bytes=100_000, wall_seconds=5)
    r = sandbox.run("import sys\nfor _ in range(10**6):\n    sys.stdout.write('x' * 100)\n",
                    limits=limits)
    assert r.truncated and len(r.stdout) == 1000 and r.returncode != 0  # EFBIG at 100 kB


@pytest.fixture
def listening_socket():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    accepted = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield server.getsockname()[1], accepted
    stop.set()
    t.join()
    server.close()


def test_network_is_blocked(sandbox, listening_socket):
    port, accepted = listening_socket
    py = sandbox.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
                    limits=FAST)
    assert py.returncode == 1 and "network access is disabled" in py.stderr
    # raw connect(2) through libc, bypassing the audit hook
    code = _libc_prelude() + (
        "import socket, struct\n"
        "s = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)\n"
        f"addr = struct.pack('=HH4s8x', socket.AF_INET, socket.htons({port}), "
        "socket.inet_aton('127.0.0.1'))\n"
        "rc = libc.connect(s, addr, len(addr))\n"
        "print('connect', rc, ctypes.get_errno())\n"
    )
    r = sandbox.run(code, limits=FAST)
    time.sleep(0.3)
    assert accepted == []
    if sandbox.support["netns"]:
        assert "connect -1" in r.stdout


def test_network_allowed_when_asked(sandbox, listening_socket):
    port, accepted = listening_socket
    r = sandbox.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                   "print('connected')", limits=SandboxLimits(network=True, wall_seconds=5))
    assert r.ok and "connected" in r.stdout


async def test_concurrent_async_runs(sandbox):
    results = await asyncio.gather(
        *(arun_python(f"print({i} * 2)", limits=FAST, backend=sandbox.backend) for i in range(4))
    )
    assert [r.stdout.strip() for r in results] == ["0", "2", "4", "6"]
    assert all("rlimits" in r.isolation for r in results)
