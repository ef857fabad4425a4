"""The trainer registers its vocabulary size and max_token_len; servers that do not know them still work."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import httpx
import pytest

from atroposlib.api.client import AtroposClient
from atroposlib.api.store import open_store
from example_trainer.config import TrainerConfig
from example_trainer.grpo import train
from tests.example_trainer.test_grpo_loop import _group, needs_tokenizer, tiny_model  # noqa: F401
from tests.fixtures.api_server import free_port, start_run_api
from tests.fixtures.upstream import ensure_upstream_venv


def _one_step(model, api_url, run_dir) -> dict:
    """Train one step; the groups are posted after the trainer registered (Atropos 0.4's server
    never initialises a registration once data was posted before it)."""
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(train(TrainerConfig(
        model=str(model), run_dir=str(run_dir), api_url=api_url, vllm_url="http://127.0.0.1:9/v1",
        weight_sync="none", training_steps=1, batch_size=8, micro_batch_size=8, max_token_len=64,
        batch_timeout=60, torch_threads=1))))
    thread.start()
    with AtroposClient(api_url) as client:
        deadline = time.monotonic() + 120
        while client.info()["batch_size"] != 8:
            assert thread.is_alive() and time.monotonic() < deadline, "the trainer did not register"
            time.sleep(0.2)
        for seed in range(2):
            client.post_scored_data(_group(seed))
    thread.join(120)
    assert not thread.is_alive()
    return result


@needs_tokenizer
def test_the_registration_carries_vocab_size_and_max_token_len(tiny_model, tmp_path):  # noqa: F811
    db = tmp_path / "queue.db"
    api = start_run_api(db=db)
    try:
        assert _one_step(tiny_model, api.url, tmp_path / "run")["steps"] == 1
    finally:
        api.stop()
    store = open_store(db)
    try:
        registration = store.load().meta["registration"]
    finally:
        store.close()
    assert registration["vocab_size"] == 49152  # the tiny Llama's embedding rows
    assert registration["max_token_len"] == 64


@pytest.fixture
def upstream_run_api(tmp_path):
    """Atropos 0.4.0's own run-api (from its venv), which knows neither field."""
    python = ensure_upstream_venv()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with (tmp_path / "upstream.log").open("wb") as log:
        proc = subprocess.Popen([str(python), "-m", "atroposlib.cli.run_api", "--host", "127.0.0.1",
                                 "--port", str(port)], cwd=tmp_path, stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "upstream.log").read_text()[-2000:]
            try:
                if httpx.get(url + "/info", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "upstream run-api did not start"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


@needs_tokenizer
def test_atropos_04_run_api_ignores_the_new_fields(tiny_model, upstream_run_api, tmp_path):  # noqa: F811
    assert _one_step(tiny_model, upstream_run_api, tmp_path / "run")["steps"] == 1
    assert httpx.get(upstream_run_api + "/info").json() == {"batch_size": 8, "max_token_len": 64}
