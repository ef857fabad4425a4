"""The vLLM a trainer launches lives and dies with it: real ``atropos-grpo``, real vLLM (e2e)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.fixtures.api_server import start_run_api

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _trainer(model_dir: Path, run_dir: Path, api_url: str, log, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "example_trainer.grpo", "--model", str(model_dir), "--run-dir",
         str(run_dir), "--api-url", api_url, "--training-steps", "2", "--batch-size", "4",
         "--micro-batch-size", "4", "--batch-timeout", "600", "--vllm-max-model-len", "512",
         "--torch-threads", "1", *extra],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_line(path: Path, pattern: str, proc: subprocess.Popen, timeout: float = 300) -> re.Match:
    deadline = time.monotonic() + timeout
    while True:
        match = re.search(pattern, path.read_text(errors="replace"))
        if match:
            return match
        assert proc.poll() is None, f"trainer exited ({proc.returncode}):\n{path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {pattern!r} in the trainer log"
        time.sleep(0.5)


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
    return True


def test_sigkill_to_the_trainer_takes_its_vllm_down(bundled_model_dir, tmp_path):
    api = start_run_api()
    log_path = tmp_path / "trainer.log"
    vllm_group: list[psutil.Process] = []
    try:
        with log_path.open("wb") as log:
            trainer = _trainer(bundled_model_dir, tmp_path / "run", api.url, log)
            try:
                url = _wait_for_line(log_path, r"vLLM ready at (http://\S+)", trainer).group(1)
                port = int(url.rsplit(":", 1)[1].split("/")[0])
                vllm_group = [p for p in psutil.Process(trainer.pid).children(recursive=True)]
                assert any("vllm" in " ".join(p.cmdline()) for p in vllm_group), vllm_group
                assert not _port_is_free(port)
                trainer.send_signal(signal.SIGKILL)  # no handler, no atexit, no finally runs
                trainer.wait(10)
                gone, alive = psutil.wait_procs(vllm_group, timeout=60)
                deadline = time.monotonic() + 30
                while not _port_is_free(port) and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert not alive, f"vLLM processes outlived the SIGKILLed trainer: {alive}"
                assert _port_is_free(port), f"port {port} still taken after the trainer was killed"
            finally:
                if trainer.poll() is None:
                    trainer.kill()
    finally:
        for proc in vllm_group:  # leave nothing behind when a check fails
            with contextlib.suppress(psutil.Error):
                proc.kill()
        api.stop()
