"""Tests of the code-execution sandbox: normal runs and hostile programs (atroposlib.utils.sandbox)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from atroposlib.utils.sandbox import SandboxLimits, arun_python, isolation_support, run_python

SUPPORT = isolation_support()
FAST = SandboxLimits(cpu_seconds=2, wall_seconds=4)
# The private uids a root host gives runs (see sandbox.run_python).
RUN_UID_MIN = 1_000_000_000


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


def test_normal_program_stdin_files_and_exit_code():
    code = (
        "import sys, json\n"
        "data = sys.stdin.read()\n"
        "extra = open('data/in.txt').read()\n"
        "open('out.txt', 'w').write('scratch is writable')\n"
        "print(json.dumps([data, extra, open('out.txt').read()]))\n"
        "sys.exit(7)\n"
    )
    r = run_python(code, stdin="hello", files={"data/in.txt": "extra"}, limits=FAST)
    assert r.returncode == 7 and not r.timed_out and not r.ok
    assert r.stdout.strip() == '["hello", "extra", "scratch is writable"]'
    ok = run_python("print(sum(range(10)))", limits=FAST)
    assert ok.ok and ok.stdout == "45\n"


def test_exception_is_a_result_with_traceback():
    r = run_python("def f():\n    raise ValueError('nope')\nf()", limits=FAST)
    assert r.returncode == 1 and "ValueError: nope" in r.stderr


def test_files_cannot_escape_scratch():
    with pytest.raises(ValueError, match="escapes the scratch"):
        run_python("pass", files={"../x.py": "1"})


def test_limits_are_validated():
    with pytest.raises(ValueError, match="cpu_seconds must be > 0"):
        SandboxLimits(cpu_seconds=0)
    with pytest.raises(ValueError, match="max_processes must be >= 2"):
        SandboxLimits(max_processes=1)


def test_infinite_loop_killed_by_cpu_limit():
    start = time.monotonic()
    r = run_python("while True:\n    pass\n", limits=SandboxLimits(cpu_seconds=1, wall_seconds=20))
    assert r.returncode == -9 and not r.timed_out
    assert time.monotonic() - start < 15


def test_sleeping_program_killed_by_wall_clock():
    r = run_python("import time\nprint('started')\ntime.sleep(60)\n", limits=SandboxLimits(wall_seconds=1))
    assert r.timed_out and r.returncode == -9 and not r.ok
    assert r.duration_s < 5
    assert r.stdout == "started\n"  # unbuffered: output before the kill is kept


def test_huge_allocation_fails_inside_the_sandbox():
    r = run_python("x = bytearray(20 * 1024**3)\nprint('allocated')",
                   limits=SandboxLimits(memory_bytes=256 * 1024**2, wall_seconds=10))
    assert "MemoryError" in r.stderr and "allocated" not in r.stdout
    # a ctypes malloc is bounded by RLIMIT_AS too
    r = run_python(_libc_prelude() + "libc.malloc.restype = ctypes.c_void_p\n"
                   "print(libc.malloc(ctypes.c_size_t(20 * 1024**3)))",
                   limits=SandboxLimits(memory_bytes=256 * 1024**2))
    assert r.stdout.strip() == "None"


def test_fork_bomb_is_bounded_and_cleaned_up():
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
    r = run_python(bomb, limits=SandboxLimits(max_processes=16, wall_seconds=3, cpu_seconds=10))
    assert r.timed_out and time.monotonic() - start < 15
    time.sleep(0.5)
    # the host still works: it can start processes, and nothing of the bomb is left
    assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True).stdout == b"1\n"
    if SUPPORT["uid"]:
        assert _run_uid_processes() == []
    assert len(psutil.pids()) < before_pids + 10


def test_fork_bomb_never_exceeds_the_process_limit():
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
    r = run_python(code, limits=SandboxLimits(max_processes=8, wall_seconds=5))
    children = r.stdout.count("child")
    assert "refused" in r.stdout and 1 <= children <= 8


@pytest.mark.skipif(not SUPPORT["pidns"] and not SUPPORT["uid"],
                    reason="needs a PID namespace or a private uid to catch setsid() escapes")
def test_setsid_daemon_does_not_outlive_the_run():
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
    r = run_python(code, limits=FAST)
    assert r.ok and "parent done" in r.stdout
    time.sleep(0.3)
    if SUPPORT["uid"]:
        assert _run_uid_processes() == []


def test_writes_outside_scratch_are_blocked(tmp_path):
    target = tmp_path / "escape.txt"
    shared = tmp_path / "world_writable"
    shared.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(shared, 0o777)
    py = run_python(f"open({str(target)!r}, 'w').write('x')", limits=FAST)
    assert py.returncode == 1 and "outside the scratch directory" in py.stderr
    if not (SUPPORT["mountns"] or SUPPORT["uid"]):
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
        run_python(code, limits=FAST)
        assert not os.path.exists(path), path
    assert sorted(os.listdir(shared)) == []


def test_output_is_capped():
    limits = SandboxLimits(max_output_bytes=1000, file_size_bytes=100_000, wall_seconds=5)
    r = run_python("import sys\nfor _ in range(10**6):\n    sys.stdout.write('x' * 100)\n",
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


def test_network_is_blocked(listening_socket):
    port, accepted = listening_socket
    py = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
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
    r = run_python(code, limits=FAST)
    time.sleep(0.3)
    assert accepted == []
    if SUPPORT["netns"]:
        assert "connect -1" in r.stdout


def test_network_allowed_when_asked(listening_socket):
    port, accepted = listening_socket
    r = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                   "print('connected')", limits=SandboxLimits(network=True, wall_seconds=5))
    assert r.ok and "connected" in r.stdout


async def test_concurrent_async_runs():
    results = await asyncio.gather(*(arun_python(f"print({i} * 2)", limits=FAST) for i in range(4)))
    assert [r.stdout.strip() for r in results] == ["0", "2", "4", "6"]
    assert all("rlimits" in r.isolation for r in results)
