"""VLLMProcess lifecycle: command line, environment, health wait, failures, process-group stop.

The lifecycle tests run a tiny stand-in HTTP server through ``VLLMProcess`` (by overriding
``command()``), so they are fast and need no vLLM; the real-vLLM behaviour (reload_weights,
restart) is in ``test_vllm_reload.py`` (e2e).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from atroposlib.errors import InferenceError, InferenceUnavailableError
from atroposlib.inference import vllm_process
from atroposlib.inference.vllm_process import VLLMProcess

# A stand-in server: spawns a grandchild (like vLLM's engine core), answers /health after
# READY_AFTER seconds, and records the pid of its child so the test can check it was stopped.
STANDIN = textwrap.dedent(
    """
    import http.server, subprocess, sys, time, os
    port, ready_after, child_file = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(child_file, "w").write(str(child.pid))
    start = time.monotonic()
    if ready_after < 0:
        print("boom: cannot load model", flush=True)
        sys.exit(3)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/health" and time.monotonic() - start > ready_after
            self.send_response(200 if ok else 503)
            self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


class StandIn(VLLMProcess):
    def __init__(self, tmp_path, ready_after: float, **kwargs):
        super().__init__(tmp_path, log_path=tmp_path / "log.txt", **kwargs)
        self.ready_after = ready_after
        self.script = tmp_path / "standin.py"
        self.script.write_text(STANDIN)
        self.child_file = tmp_path / "child.pid"

    def command(self):
        return [
            sys.executable,
            str(self.script),
            str(self.port),
            str(self.ready_after),
            str(self.child_file),
        ]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().split(")")[-1].split()[0] != "Z"


def test_cpu_command_line_and_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_process, "vllm_is_cpu_build", lambda: True)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    proc = VLLMProcess(tmp_path, port=1234, extra_args=["--seed", "7"], env={"FOO": "bar"})
    cmd = proc.command()
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry"]
    assert cmd[cmd.index("--dtype") + 1] == "float32"  # auto -> fp32 on CPU (exact logprobs)
    assert cmd[cmd.index("--served-model-name") + 1] == "smollm2"
    assert cmd[cmd.index("--max-model-len") + 1] == "2048"
    assert "--enforce-eager" in cmd and "--gpu-memory-utilization" not in cmd
    assert cmd[cmd.index("--block-size") + 1] == "32"  # a group's rollouts share prompt blocks
    assert cmd[-2:] == ["--seed", "7"]
    own = VLLMProcess(tmp_path, port=1, extra_args=["--block-size=64"]).command()
    assert "--block-size" not in own and own[-1] == "--block-size=64"
    env = proc.environment()
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_HOST_IP"] == "127.0.0.1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert env["FOO"] == "bar"
    # oneDNN's primitive cache keeps oneDNN's own capacity (a cap of 64 cost the quickstart
    # accuracy); a capacity the caller or the environment sets reaches the server
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in env
    assert VLLMProcess(tmp_path, port=1, env={"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}
                       ).environment()["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "64"
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "8")
    assert VLLMProcess(tmp_path, port=1).environment()["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "8"
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    assert proc.base_url == "http://127.0.0.1:1234/v1"
    no_dev = VLLMProcess(tmp_path, port=1, dev_mode=False, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert "VLLM_SERVER_DEV_MODE" not in no_dev.environment() or os.environ.get(
        "VLLM_SERVER_DEV_MODE"
    )
    assert no_dev.environment()["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_cpu_sizing_and_the_worker_inside_the_engine(tmp_path, monkeypatch):
    """A sized KV cache goes on the command line (the legacy variable would override it), and
    the worker runs inside the engine core with vLLM's own thread count."""
    monkeypatch.setattr(vllm_process, "vllm_is_cpu_build", lambda: True)
    for var in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    proc = VLLMProcess(tmp_path, port=1, kv_cache_bytes=123_456_789, max_num_seqs=64)
    cmd, env = proc.command(), proc.environment()
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == "123456789"
    assert cmd[cmd.index("--max-num-seqs") + 1] == "64"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["OMP_NUM_THREADS"] == str(vllm_process.cpu_worker_threads())
    assert 1 <= vllm_process.cpu_worker_threads() <= max(1, len(os.sched_getaffinity(0)) - 1)
    own = VLLMProcess(tmp_path, port=1, kv_cache_bytes=5, max_num_seqs=4, worker_in_engine=False,
                      extra_args=["--kv-cache-memory-bytes", "9", "--max-num-seqs=8"])
    cmd, env = own.command(), own.environment()
    assert cmd.count("--kv-cache-memory-bytes") == 1 and cmd.count("--max-num-seqs") == 0
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env  # vLLM's default: a worker process
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # the user's choice wins
    assert VLLMProcess(tmp_path, port=1).environment()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        VLLMProcess(tmp_path, kv_cache_bytes=0)


def test_sizing_for_a_training_run(bundled_model_dir):
    from atroposlib.inference.sizing import (
        MAX_AUTO_KV_CACHE_GIB,
        kv_bytes_per_token,
        kv_cache_bytes,
        size_for_training,
    )

    # SmolLM2-135M: 2 x 30 layers x 3 KV heads x 64 dims x 2 bytes
    assert kv_bytes_per_token(bundled_model_dir, "bfloat16") == 23_040
    assert kv_bytes_per_token(bundled_model_dir, "float32") == 46_080
    # 64 sequences x 8 blocks of 32 tokens, plus the null block
    assert kv_cache_bytes(100, 64, 256, 512, 32) == (64 * 8 + 1) * 32 * 100
    assert kv_cache_bytes(100, 1, 10, 512, 32) == (16 + 1) * 32 * 100  # one max_model_len request
    quickstart = size_for_training(bundled_model_dir, "bfloat16", batch_size=16, max_token_len=256,
                                   max_model_len=512, block_size=32)
    assert quickstart.max_num_seqs == 64
    assert quickstart.kv_cache_bytes == (64 * 8 + 1) * 32 * 23_040  # 0.35 GiB, not 2
    big = size_for_training(bundled_model_dir, "float32", 512, 4096, 4096, 32)
    assert big.max_num_seqs == 256 and big.kv_cache_bytes == int(MAX_AUTO_KV_CACHE_GIB * 2**30)
    assert size_for_training(bundled_model_dir, "bfloat16", 16, 256, 512, 32, 8, 0.5) == \
        type(quickstart)(8, 2**29)
    assert size_for_training("org/hub-id", "bfloat16", 16, 256, 512, 32).kv_cache_bytes is None
    with pytest.raises(ValueError, match="dtype"):
        kv_bytes_per_token(bundled_model_dir, "int4")


def test_gpu_command_line(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_process, "vllm_is_cpu_build", lambda: False)
    cmd = VLLMProcess(tmp_path, port=1, dtype="bfloat16").command()
    assert "--enforce-eager" not in cmd and "--block-size" not in cmd
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.45"
    cmd = VLLMProcess(tmp_path, port=1, extra_args=["--gpu-memory-utilization=0.9"]).command()
    assert cmd.count("--gpu-memory-utilization") == 0 and cmd[-1] == "--gpu-memory-utilization=0.9"
    assert cmd[cmd.index("--dtype") + 1] == "auto"


def test_bad_arguments_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="dtype"):
        VLLMProcess(tmp_path, dtype="int3")
    with pytest.raises(ValueError, match="max_model_len"):
        VLLMProcess(tmp_path, max_model_len=0)
    with pytest.raises(RuntimeError, match="start"):
        VLLMProcess(tmp_path).base_url  # noqa: B018 - the port is only chosen at start()


def test_start_waits_for_health_and_stop_kills_the_whole_group(tmp_path):
    proc = StandIn(tmp_path, ready_after=1.0)
    begin = time.monotonic()
    with proc:
        assert time.monotonic() - begin >= 1.0  # waited for /health, not just the port
        assert httpx.get(proc.root_url + "/health").status_code == 200
        assert proc.port is not None and proc.is_running()
        child = int(proc.child_file.read_text())
        leader = proc.proc.pid
        assert os.getpgid(child) == leader  # its own process group
        assert os.getpgid(leader) != os.getpgid(0)
    assert not proc.is_running()
    time.sleep(0.2)
    assert not _alive(child), "the server's child process survived stop()"
    proc.stop()  # idempotent


def test_start_raises_with_log_tail_when_the_server_dies(tmp_path):
    proc = StandIn(tmp_path, ready_after=-1)
    with pytest.raises(InferenceError, match="(?s)exited with code 3.*boom: cannot load model"):
        proc.start(timeout=30)
    assert not proc.is_running()
    time.sleep(0.2)
    child = int(proc.child_file.read_text())
    survived = _alive(child)
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, 9)
    assert not survived, "what the server spawned outlived its failed start"


def test_start_times_out_and_stops_the_server(tmp_path):
    proc = StandIn(tmp_path, ready_after=3600)
    with pytest.raises(InferenceUnavailableError, match="not healthy after 2 s"):
        proc.start(timeout=2)
    assert proc.proc is None
    child = int(proc.child_file.read_text())
    time.sleep(0.2)
    assert not _alive(child)


def test_restart_returns_seconds_and_serves_again(tmp_path):
    proc = StandIn(tmp_path, ready_after=0.2)
    with proc:
        first_pid, port = proc.proc.pid, proc.port
        seconds = proc.restart()
        assert seconds > 0.2
        assert proc.proc.pid != first_pid and proc.port == port
        assert httpx.get(proc.root_url + "/health").status_code == 200


def test_reload_weights_validates_its_input(tmp_path):
    proc = VLLMProcess(tmp_path, port=1)
    with pytest.raises(FileNotFoundError, match="safetensors"):
        proc.reload_weights(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(RuntimeError, match="not running"):
        proc.reload_weights(tmp_path)


# ``python -m atroposlib.inference.vllm_process`` with the stand-in server as "vLLM".
MAIN_WITH_STANDIN = textwrap.dedent(
    """
    import sys
    from atroposlib.inference import vllm_process

    script, child_file = sys.argv[1], sys.argv[2]
    vllm_process.VLLMProcess.command = lambda self: [
        sys.executable, script, str(self.port), "0", child_file]
    sys.exit(vllm_process.main(sys.argv[3:]))
    """
)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 0)])
def test_main_stops_vllm_on_sigterm_and_ctrl_c(tmp_path, sig, code):
    """SIGTERM to the foreground runner stops vLLM's process group too, as Ctrl-C does.

    vLLM runs in its own session, so a signal sent to the runner alone never reaches it: without
    a SIGTERM handler the runner died at once and left vLLM and its engine core running.
    """
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    child_file = tmp_path / "child.pid"
    runner = subprocess.Popen(
        [sys.executable, "-c", MAIN_WITH_STANDIN, str(script), str(child_file),
         "--model", str(tmp_path), "--log", str(tmp_path / "log.txt"), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    leader = None
    try:
        lines = []
        for line in runner.stdout:  # "vLLM serving ..." then "Ctrl-C to stop"
            lines.append(line)
            if "Ctrl-C to stop" in line:
                break
        assert "Ctrl-C to stop" in "".join(lines), "".join(lines)
        leader = int(next(p for p in Path("/proc").glob("[0-9]*")
                          if _is_standin(p, script)).name)
        child = int(child_file.read_text())
        runner.send_signal(sig)
        returncode = runner.wait(30)
        time.sleep(0.2)
        survivors = [pid for pid in (leader, child) if _alive(pid)]
    finally:
        if runner.poll() is None:
            runner.kill()
        if leader is not None:  # leave nothing behind when a check fails
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader, signal.SIGKILL)
    assert returncode == code
    assert not survivors, "the vLLM stand-in (or its child, like vLLM's engine core) outlived its runner"


def _is_standin(proc_dir: Path, script: Path) -> bool:
    """Whether ``proc_dir`` is the stand-in server itself (``python SCRIPT PORT ...``)."""
    try:
        argv = (proc_dir / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return len(argv) > 1 and argv[1] == str(script)


# A launcher that starts the stand-in through VLLMProcess, prints its pids, then waits forever.
LAUNCHER = textwrap.dedent(
    """
    import sys, time
    from atroposlib.inference import vllm_process

    script, child_file, model, die = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    vllm_process.VLLMProcess.command = lambda self: [
        sys.executable, script, str(self.port), "0", child_file]
    proc = vllm_process.VLLMProcess(model, log_path=model + "/log.txt", die_with_parent=die)
    proc.start(timeout=30)
    print(proc.proc.pid, proc.port, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("die_with_parent", [True, False])
def test_the_server_dies_with_a_sigkilled_launcher(tmp_path, die_with_parent):
    """SIGKILL to the process that started the server: no handler or atexit hook of it runs.

    The kernel's parent-death signal (PR_SET_PDEATHSIG) still reaches the server; without it
    (die_with_parent=False, the behaviour before) the server keeps running and holds its port.
    """
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(script), str(tmp_path / "child.pid"), str(tmp_path),
         "1" if die_with_parent else "0"], stdout=subprocess.PIPE, text=True)
    leader = None
    try:
        leader, port = map(int, launcher.stdout.readline().split())
        assert _alive(leader)
        launcher.kill()
        launcher.wait(10)
        deadline = time.monotonic() + 10
        while _alive(leader) and time.monotonic() < deadline:
            time.sleep(0.05)
        survived = _alive(leader)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if leader is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader, signal.SIGKILL)
    assert survived != die_with_parent
    if die_with_parent:  # nothing listens on the port any more (SO_REUSEADDR: TIME_WAIT is fine)
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen()


def test_parent_death_preexec_is_linux_only(monkeypatch):
    assert callable(vllm_process.parent_death_preexec())
    monkeypatch.setattr(vllm_process.sys, "platform", "darwin")
    assert vllm_process.parent_death_preexec() is None
