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


def test_a_vllm_killed_mid_run_ends_the_trainer_with_a_checkpoint(bundled_model_dir, tmp_path):
    """SIGKILL to vLLM while the trainer waits for a batch: the trainer names vLLM as dead (the
    health watch, not the next weight sync), saves the step it trained and exits with 1."""
    import json

    from atroposlib.api.client import AtroposClient
    from tests.example_trainer.test_grpo_loop import _group

    api = start_run_api()
    log_path = tmp_path / "trainer.log"
    run = tmp_path / "run"
    vllm_group: list[psutil.Process] = []
    try:
        with log_path.open("wb") as log, AtroposClient(api.url) as client:
            trainer = _trainer(bundled_model_dir, run, api.url, log, "--training-steps", "3")
            try:
                _wait_for_line(log_path, r"vLLM ready at", trainer)
                vllm_group = list(psutil.Process(trainer.pid).children(recursive=True))
                server = next(p for p in vllm_group if "api_server" in " ".join(p.cmdline()))
                client.post_scored_data(_group(0))  # one batch of 4: step 1, then a wait
                _wait_for_line(log_path, r"step 1[/:]", trainer)
                server.kill()
                code = trainer.wait(120)
            finally:
                if trainer.poll() is None:
                    trainer.kill()
        text = log_path.read_text()
        assert code == 1, text[-3000:]
        assert re.search(r"vLLM died: vLLM \(pid \d+, port \d+\) was killed by SIGKILL", text), text[-3000:]
        assert "call start() first" not in text
        summary = json.loads((run / "summary.json").read_text())
        assert summary["stopped"] == "error" and summary["failed_part"] == "vllm"
        assert summary["steps"] == 1 and summary["last_checkpoint"] == str(run / "checkpoints" / "step_1")
        gone, alive = psutil.wait_procs(vllm_group, timeout=30)
        assert not alive, f"vLLM processes outlived the run: {alive}"
    finally:
        for proc in vllm_group:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        api.stop()


def test_a_restart_sync_is_not_taken_for_a_dead_vllm(bundled_model_dir, tmp_path):
    """--weight-sync restart stops vLLM on purpose after every step: the health watch must wait."""
    from atroposlib.api.client import AtroposClient
    from tests.example_trainer.test_grpo_loop import _group

    api = start_run_api()
    log_path = tmp_path / "trainer.log"
    try:
        with log_path.open("wb") as log, AtroposClient(api.url) as client:
            # One step is one restart (the sync after every step): enough to show the watch
            # waits, at the cost of a single extra vLLM start.
            trainer = _trainer(bundled_model_dir, tmp_path / "run", api.url, log,
                               "--weight-sync", "restart", "--training-steps", "1")
            try:
                _wait_for_line(log_path, r"registered with", trainer)
                client.post_scored_data(_group(0))
                code = trainer.wait(600)
            finally:
                if trainer.poll() is None:
                    trainer.kill()
        text = log_path.read_text()
        assert code == 0, text[-3000:]
        assert "vLLM died" not in text and text.count("sync/update_seconds=") == 1
    finally:
        api.stop()
