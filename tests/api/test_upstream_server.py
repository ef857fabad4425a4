"""Our env-side client against UPSTREAM Atropos 0.4.0's run-api (started from its own venv).

Checks the wire path an env uses when serving into an Atropos run: register, /status-env (the
env id as a JSON body on the GET, the only form upstream reads), posting a scored group, and
the trainer getting it back in a batch. Skipped, with the reason, when the upstream venv cannot
be created here (no package index reachable).
"""

from __future__ import annotations

import os
import subprocess
import time

import httpx
import pytest

from atroposlib.api.client import AsyncAtroposClient
from atroposlib.api.models import RegisterEnv, Registration
from tests.fixtures.api_server import free_port
from tests.fixtures.upstream import ensure_upstream_venv


@pytest.fixture
def upstream_api(tmp_path_factory):
    # One server per test: upstream keeps the first trainer registration's settings.
    try:
        python = ensure_upstream_venv()
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot create the atroposlib==0.4.0 venv offline: {exc}")
    port = free_port()
    scratch = tmp_path_factory.mktemp("upstream-api")  # cwd without our atroposlib on it
    log = open(scratch / "run-api.log", "wb")  # noqa: SIM115 - closed below
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(
        [str(python), "-m", "atroposlib.cli.run_api", "--host", "127.0.0.1", "--port", str(port)],
        cwd=scratch, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                pytest.fail(f"upstream run-api exited: {(scratch / 'run-api.log').read_text()[-2000:]}")
            try:
                if httpx.get(url + "/info", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


async def test_our_client_registers_polls_and_posts_into_upstream_run_api(upstream_api):
    async with AsyncAtroposClient(upstream_api) as client:
        await client.register(Registration(
            wandb_group="g", wandb_project="p", batch_size=4, max_token_len=64,
            checkpoint_dir="/tmp/ckpt", save_checkpoint_interval=10, starting_step=0,
            num_steps=5))
        assert await client.get_batch() is None  # the trainer's first poll opens env registration
        reg = await client.register_env(RegisterEnv(
            max_token_length=64, desired_name="compat", weight=1.0, group_size=4))
        assert reg["status"] == "success"
        env_id = reg["env_id"]
        status = await client.status_env(env_id)  # upstream answers 422 to ?env_id=N
        assert status["current_step"] == 0 and status["self_queue_size"] == 0
        group = {"tokens": [[1, 2, 3, i] for i in range(4)], "masks": [[-100, 2, 3, i] for i in range(4)],
                 "scores": [1.0, -1.0, 0.5, 0.0], "env_id": env_id}
        await client.post_scored_data(group)
        assert (await client.status_env(env_id))["self_queue_size"] == 1
        batch = await client.get_batch()
        assert batch is not None and [g["scores"] for g in batch] == [group["scores"]]


def test_our_env_serves_batches_into_upstream_run_api(upstream_api, tmp_path):
    # The whole env side (serve loop, /status-env polling, posting) against Atropos 0.4's server:
    # with the env id sent as ?env_id=N, upstream answered 422 and the trainer got no batch.
    from atroposlib.testing.fake_server import FakeOpenAIServer
    from atroposlib.testing.tiny_tokenizer import make_tiny_tokenizer
    from tests.envs.test_serve import (
        _check_batch,
        _pull_batches,
        _register_trainer,
        _start_env,
        _stop,
    )

    tokenizer_dir = tmp_path / "tokenizer"
    make_tiny_tokenizer(tokenizer_dir)
    log = tmp_path / "env.log"
    with FakeOpenAIServer() as inference:
        trainer = _register_trainer(upstream_api, tmp_path)
        proc = _start_env(upstream_api, inference.base_url, tokenizer_dir, log)
        try:
            batches = _pull_batches(trainer, 2, timeout=120)
        finally:
            output = _stop(proc, log)
    assert len(batches) == 2, output[-3000:]
    for batch in batches:
        assert sum(len(g["tokens"]) for g in batch) == 8
        _check_batch(batch)
