"""Serve mode end to end: an env subprocess, a real run-api, a fake trainer and fake inference."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from atroposlib.api.client import AtroposClient
from atroposlib.api.models import Registration
from atroposlib.testing.fake_server import FakeOpenAIServer
from tests.fixtures.api_server import pull_batches, start_run_api
from tests.fixtures.processes import stop_process

REPO = Path(__file__).resolve().parents[2]


def _register_trainer(url: str, tmp_path: Path, batch_size: int = 8) -> AtroposClient:
    trainer = AtroposClient(url)
    trainer.register(Registration(
        wandb_group="g", wandb_project="p", batch_size=batch_size, max_token_len=512,
        checkpoint_dir=str(tmp_path / "ckpt"), save_checkpoint_interval=-1, starting_step=0,
        num_steps=1000,
    ))
    assert trainer.get_batch() is None  # the first /batch lets envs register
    return trainer


def _start_env(api_url: str, inference_url: str, tokenizer_dir: Path, log: Path, *extra: str):
    args = [
        sys.executable, "-m", "tests.fixtures.sample_envs", "ChatLengthEnv", "serve",
        "--env.tokenizer_name", str(tokenizer_dir), "--env.rollout_server_url", api_url,
        "--openai.base_url", inference_url, "--env.use_wandb", "false",
        "--env.max_batches_offpolicy", "2", *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(args, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)



def _stop(proc: subprocess.Popen, log: Path) -> str:
    stop_process(proc, timeout=45)
    return log.read_text(errors="replace")


def _check_batch(batch: list, group_size: int = 4) -> None:
    for group in batch:
        assert len(group["tokens"]) == group_size
        assert [len(t) for t in group["tokens"]] == [len(m) for m in group["masks"]]
        assert len(set(group["scores"])) > 1  # identical-score groups are dropped env-side
        assert group["env_id"] is not None
        assert group["messages"][0][-1]["role"] == "assistant"
        for tokens, masks in zip(group["tokens"], group["masks"], strict=True):
            assert masks[0] == -100 and masks[-1] == tokens[-1]


def _serve_and_pull(api_url, inference_url, tokenizer_dir, tmp_path, n, timeout):
    """Serve the test env into ``api_url``; pull and check ``n`` batches as a trainer; stop the env.

    Returns ``(proc, output)``: the stopped env process and its log.
    """
    log = tmp_path / "env.log"
    trainer = _register_trainer(api_url, tmp_path)
    proc = _start_env(api_url, inference_url, tokenizer_dir, log)
    try:
        batches = pull_batches(trainer, n, timeout=timeout)
    finally:
        output = _stop(proc, log)
    assert len(batches) == n, output[-3000:]
    for batch in batches:
        assert sum(len(g["tokens"]) for g in batch) == 8
        _check_batch(batch)
    return proc, output


def test_serve_feeds_the_trainer_and_disconnects_on_sigint(tiny_tokenizer_dir, tmp_path):
    api = start_run_api()
    try:
        with FakeOpenAIServer() as inference:
            proc, output = _serve_and_pull(api.url, inference.base_url, tiny_tokenizer_dir,
                                           tmp_path, 3, timeout=240)
            assert proc.returncode == 0, output[-3000:]
            assert "disconnected env_id=0" in output
            # Health checks are GET /models, never completions: every chat request made a group.
            assert all(r.kind == "chat" for r in inference.server.requests)
    finally:
        api.stop()


def test_serve_survives_api_restart_and_inference_outage(tiny_tokenizer_dir, tmp_path):
    api = start_run_api()
    port = api.port
    log = tmp_path / "env.log"
    proc = None
    try:
        with FakeOpenAIServer() as inference:
            trainer = _register_trainer(api.url, tmp_path)
            proc = _start_env(api.url, inference.base_url, tiny_tokenizer_dir, log)
            assert len(pull_batches(trainer, 1, timeout=240)) == 1, log.read_text()[-3000:]

            # 1) The API restarts and forgets everything: the env must re-register.
            api.stop()
            time.sleep(2)
            api = start_run_api(port=port)
            trainer = _register_trainer(api.url, tmp_path)
            batches = pull_batches(trainer, 2, timeout=240)
            assert len(batches) == 2, log.read_text()[-3000:]
            for batch in batches:
                _check_batch(batch)

            # 2) Inference goes away for a while, then comes back: the env resumes. The trainer
            # keeps pulling so the env has room and must hit the dead server.
            inference.stop()
            deadline = time.monotonic() + 60
            while "item re-queued" not in log.read_text() and time.monotonic() < deadline:
                trainer.get_batch()
                time.sleep(0.2)
            assert "item re-queued" in log.read_text(), log.read_text()[-3000:]
            assert proc.poll() is None, log.read_text()[-3000:]
            inference.start()
            batches = pull_batches(trainer, 2, timeout=240)
            assert len(batches) == 2, log.read_text()[-3000:]
            output = _stop(proc, log)
            assert proc.returncode == 0, output[-3000:]
            assert "re-registered" in output
            assert "groups_dropped_error" not in output  # outage items were re-queued, not dropped
    finally:
        if proc is not None and proc.poll() is None:
            _stop(proc, log)
        api.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_serve_stops_cleanly_on_sigterm_while_waiting_for_trainer(tiny_tokenizer_dir, tmp_path, sig):
    api = start_run_api()  # no trainer: the env keeps hearing "wait for trainer to start"
    log = tmp_path / "env.log"
    try:
        proc = _start_env(api.url, "http://127.0.0.1:9/v1", tiny_tokenizer_dir, log)
        # signal once the serve loop runs (its handlers are installed), not after a fixed sleep
        # that a loaded machine may not have spent on start-up yet
        deadline = time.monotonic() + 120
        while "waiting for the trainer" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        assert proc.poll() is None
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == 0, log.read_text()[-3000:]
    finally:
        api.stop()
