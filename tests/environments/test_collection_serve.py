"""A collection env in `serve` mode, run as a script, feeds a real run-api and trainer client."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from atroposlib.api.client import AtroposClient
from atroposlib.api.models import Registration
from tests.fixtures.api_server import start_run_api
from tests.fixtures.processes import stop_process

REPO = Path(__file__).resolve().parents[2]


def test_letter_counting_serve_script_feeds_the_trainer(tok_dir, tmp_path):
    api = start_run_api()
    log = tmp_path / "env.log"
    proc = None
    try:
        trainer = AtroposClient(api.url)
        trainer.register(Registration(
            wandb_group="g", wandb_project="p", batch_size=8, max_token_len=1024,
            checkpoint_dir=str(tmp_path / "ckpt"), save_checkpoint_interval=-1, starting_step=0,
            num_steps=100,
        ))
        assert trainer.get_batch() is None  # lets envs register
        # `python environments/x.py` (not -m): the script must find its package by itself.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.Popen(
            [sys.executable, "environments/letter_counting_env.py", "serve", "--testing",
             "--env.tokenizer_name", tok_dir, "--env.rollout_server_url", api.url,
             "--env.group_size", "4", "--env.use_wandb", "false",
             "--env.ensure_scores_are_not_same", "false"],
            cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )
        batch, deadline = None, time.monotonic() + 240  # generous: a loaded CI box is 2-5x slower
        while batch is None and time.monotonic() < deadline and proc.poll() is None:
            batch = trainer.get_batch()
            time.sleep(0.2)
        assert batch, log.read_text(errors="replace")[-3000:]
        assert sum(len(g["tokens"]) for g in batch) == 8
        for group in batch:
            assert "How many times does" in group["messages"][0][1]["content"]
            assert [len(t) for t in group["tokens"]] == [len(m) for m in group["masks"]]
    finally:
        stop_process(proc)
        api.stop()
    assert proc.returncode == 0, log.read_text(errors="replace")[-3000:]
