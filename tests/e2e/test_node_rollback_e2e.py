"""End to end: an update that real vLLM fails half-way is rolled back, and the version stays.

The node serves the bundled model under a hub id (``atropos-test/smollm2``, a snapshot in a
private Hugging Face cache), the one case where the node cannot check a push against the
model's shapes and vLLM is the first to see a bad tensor. A push holds good tensors of three
decoder blocks, then (in the order vLLM loads them) a final norm of the wrong shape: vLLM has
changed the blocks by the time it fails. The node must put the last good weights back in the
running engine (the starting model, then the last push) and keep serving the old version.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from atroposlib.inference.node.models import POLICY_VERSION_HEADER, content_digest
from tests.fixtures.api_server import free_port

REPO = Path(__file__).resolve().parents[2]
KEY = "rollback-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
HUB_ID = "atropos-test/smollm2"
PROMPT = "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\nThe answer is 12."
#: Largest per-token log-prob difference between two reads of the same weights (fp32 vLLM).
SAME_WEIGHTS = 1e-4

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]


def _hub_cache(model_dir: Path, hf_home: Path) -> None:
    """Make ``HUB_ID`` resolve offline to ``model_dir``'s files (a cache snapshot of links)."""
    repo = hf_home / "hub" / f"models--{HUB_ID.replace('/', '--')}"
    commit = "0" * 40
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in model_dir.iterdir():
        (snapshot / file.name).symlink_to(file)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def _start_node(port: int, hf_home: Path, tmp_path: Path) -> subprocess.Popen:
    log = open(tmp_path / "node.log", "wb")  # noqa: SIM115 - the child owns it
    env = {**os.environ, "ATROPOS_API_KEY": KEY, "HF_HOME": str(hf_home),
           "HF_HUB_CACHE": str(hf_home / "hub"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "atroposlib.cli.inference_node", "--model", HUB_ID, "--port", str(port),
         "--dtype", "float32", "--serve-base", "--weights-dir", str(tmp_path / "weights"),
         "--log", str(tmp_path / "vllm.log")],
        stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
    deadline = time.monotonic() + 900  # ~30 s idle; minutes on a loaded 2-core machine
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "node.log").read_text()[-4000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError("the node did not become healthy in 900 s")


def _logprobs(url: str, ids: list[int]) -> tuple[str, list[float]]:
    """The policy version header and the prompt tokens' log-probs the node serves now."""
    answer = httpx.post(f"{url}/v1/completions", headers=AUTH, timeout=300, json={
        "model": "smollm2", "prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 0,
        "temperature": 0})
    assert answer.status_code == 200, answer.text
    return (answer.headers[POLICY_VERSION_HEADER],
            [float(x) for x in answer.json()["choices"][0]["logprobs"]["token_logprobs"][1:len(ids)]])


def _gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def _push(url: str, tensors: dict, version: int) -> httpx.Response:
    from safetensors.torch import save

    body = save(tensors)
    return httpx.put(f"{url}/atropos/weights", params={"version": version}, content=body,
                     headers={**AUTH, "Content-Digest": content_digest(body)}, timeout=600)


def _failed_updates(url: str) -> float:
    metrics = httpx.get(f"{url}/atropos/metrics", headers=AUTH, timeout=30).text
    line = next(x for x in metrics.splitlines()
                if x.startswith('atropos_inference_weight_updates_total{outcome="failed"}'))
    return float(line.split()[-1])


def test_an_update_real_vllm_fails_half_way_is_rolled_back_and_the_version_stays(bundled_model_dir, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    hf_home = tmp_path / "hf"
    _hub_cache(bundled_model_dir, hf_home)
    base = load_file(bundled_model_dir / "model.safetensors")
    # good tensors first (vLLM loads a file's tensors in name order), then one of the wrong shape
    blocks = {name: tensor * 3 for name, tensor in base.items()
              if name.startswith(("model.layers.0.", "model.layers.1.", "model.layers.2."))
              and name.endswith("mlp.down_proj.weight")}
    assert len(blocks) == 3 and all(name < "model.norm.weight" for name in blocks)
    bad = {**blocks, "model.norm.weight": base["model.norm.weight"][:7].clone()}
    ids = AutoTokenizer.from_pretrained(bundled_model_dir)(PROMPT).input_ids

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start_node(port, hf_home, tmp_path)
    try:
        version, base_logprobs = _logprobs(url, ids)
        assert version == "0"

        # 1. nothing pushed yet (serving the starting model): the starting model comes back
        failed = _push(url, bad, 1)
        assert failed.status_code == 500, failed.text
        assert "keeps serving version 0" in failed.json()["detail"], failed.text
        status = httpx.get(f"{url}/atropos/status", headers=AUTH, timeout=30).json()
        assert (status["state"], status["policy_version"]) == ("serving", 0), status
        assert "update refused by vLLM" in status["last_error"]
        version, logprobs = _logprobs(url, ids)
        print(f"after the failed push at version 0: largest per-token log-prob change {_gap(logprobs, base_logprobs):.2e}")
        assert version == "0" and _gap(logprobs, base_logprobs) < SAME_WEIGHTS

        # 2. after a good push: the starting model, then that push, come back
        good = {name: tensor * 0.5 for name, tensor in base.items() if name == "model.norm.weight"}
        applied = _push(url, good, 1)
        assert applied.status_code == 200, applied.text
        version, pushed_logprobs = _logprobs(url, ids)
        assert version == "1" and _gap(pushed_logprobs, base_logprobs) > 0.05
        failed = _push(url, bad, 2)
        assert failed.status_code == 500, failed.text
        assert "keeps serving version 1" in failed.json()["detail"], failed.text
        status = httpx.get(f"{url}/atropos/status", headers=AUTH, timeout=30).json()
        assert (status["state"], status["policy_version"]) == ("serving", 1), status
        assert status["last_update"]["version"] == 1
        version, logprobs = _logprobs(url, ids)
        print(f"after the failed push at version 1: largest per-token log-prob change {_gap(logprobs, pushed_logprobs):.2e}")
        assert version == "1" and _gap(logprobs, pushed_logprobs) < SAME_WEIGHTS
        assert _failed_updates(url) == 2

        # 3. the engine still takes an update: the good part of the failed push, alone, changes
        # what is served (so had the failed push stuck half-way, the checks above would see it)
        applied = _push(url, blocks, 2)
        assert applied.status_code == 200, applied.text
        version, logprobs = _logprobs(url, ids)
        assert version == "2" and _gap(logprobs, pushed_logprobs) > 0.05
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the node stops vLLM's process group
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
