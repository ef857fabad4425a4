"""Our env-side client against UPSTREAM Atropos 0.4.0's run-api (started from its own venv).

Checks the wire path an env uses when serving into an Atropos run: register, /status-env (the
env id as a JSON body on the GET, the only form upstream reads), posting a scored group, and
the trainer getting it back in a batch. Skipped, with the reason, only when the upstream venv
cannot be built for a reason outside this machine: the package index cannot be reached, or it
has no such release (``tests.fixtures.upstream.pip_unavailable_reason``); any other failure
while building it fails.
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
from tests.fixtures.upstream import (
    UpstreamUnavailable,
    ensure_upstream_venv,
    pip_unavailable_reason,
)


@pytest.fixture
def upstream_api(tmp_path_factory):
    # One server per test: upstream keeps the first trainer registration's settings.
    try:
        python = ensure_upstream_venv()
    except UpstreamUnavailable as exc:  # no network, or no such release: nothing to test against
        pytest.skip(str(exc))
    # any other failure (a pip error, a venv that cannot be created) fails the test
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
    from tests.env_runtime.test_serve import _serve_and_pull

    tokenizer_dir = tmp_path / "tokenizer"
    make_tiny_tokenizer(tokenizer_dir)
    with FakeOpenAIServer() as inference:
        _serve_and_pull(upstream_api, inference.base_url, tokenizer_dir, tmp_path, 2, timeout=120)


# ------------------------------------------------------------------ when building upstream's venv may skip
@pytest.fixture(scope="module")
def scratch_venv(tmp_path_factory):
    """A venv directory ensure_upstream_venv may build into (never finished: every pip fails)."""
    return tmp_path_factory.mktemp("upstream-scratch") / "venv"


def _only_these_pip_settings(monkeypatch, **settings: str) -> None:
    """pip reads no config file, and only ``settings`` (PIP_* variables) from the environment."""
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for key, value in settings.items():
        monkeypatch.setenv(key, value)


def test_an_unreachable_index_skips_naming_the_network(scratch_venv, monkeypatch):
    _only_these_pip_settings(monkeypatch, PIP_INDEX_URL=f"http://127.0.0.1:{free_port()}/simple",
                             PIP_RETRIES="1", PIP_DEFAULT_TIMEOUT="3")
    with pytest.raises(UpstreamUnavailable, match="no network: .*Connection refused"):
        ensure_upstream_venv(scratch_venv)


def test_a_missing_release_skips_naming_the_package(scratch_venv, monkeypatch, tmp_path):
    _only_these_pip_settings(monkeypatch, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path))
    with pytest.raises(UpstreamUnavailable,
                       match=r"not available: no matching distribution found for atroposlib==0\.4\.0"):
        ensure_upstream_venv(scratch_venv)


def test_any_other_failure_building_the_venv_fails(scratch_venv, monkeypatch, tmp_path):
    # The release exists but its build fails: a real error, not a reason to skip.
    sdist = tmp_path / "atroposlib-0.4.0"
    sdist.mkdir()
    (sdist / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n')
    (sdist / "backend.py").write_text(
        "def get_requires_for_build_wheel(config_settings=None):\n"
        "    raise RuntimeError('this build is broken')\n")
    subprocess.run(["tar", "-czf", str(tmp_path / "atroposlib-0.4.0.tar.gz"), "-C", str(tmp_path),
                    "atroposlib-0.4.0"], check=True)
    _only_these_pip_settings(monkeypatch, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path))
    with pytest.raises(subprocess.CalledProcessError) as info:
        ensure_upstream_venv(scratch_venv)
    assert "this build is broken" in info.value.output
    assert pip_unavailable_reason(info.value.output) is None
