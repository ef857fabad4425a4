"""Real vLLM (e2e): 20 delta weight syncs leave vLLM bit-identical to the trainer's bf16 copy.

One bf16 vLLM serves the bundled model. The "trainer" is a fp32 master copy of the top two
decoder blocks and the final norm, moved each step by an Adam-sized update (``lr * sign``) and
pushed in bf16 through :class:`~atroposlib.inference.weights.local_vllm.LocalVLLM`: the first
push is a full reload, the next 20 are deltas applied inside vLLM by the worker extension.
Then the checksum of every tensor vLLM last applied equals the trainer's, and the log-probs it
serves equal those after a full reload of the same weights.
"""

from __future__ import annotations

import httpx
import pytest
import torch

from atroposlib.inference.weights import delta
from atroposlib.inference.weights.local_vllm import LocalVLLM

pytestmark = pytest.mark.e2e

PROMPT = "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n"
BLOCKS = ("model.layers.28.", "model.layers.29.")


@pytest.fixture(scope="module")
def bf16_vllm(bundled_model_dir, tmp_path_factory):
    """One bf16 vLLM with atroposlib's worker extension, dev mode on."""
    from atroposlib.inference.vllm_process import VLLMProcess

    process = VLLMProcess(bundled_model_dir, served_model_name="smollm2", dtype="bfloat16",
                          max_model_len=512, env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                          log_path=tmp_path_factory.mktemp("vllm-delta") / "vllm.log", dev_mode=True)
    process.start(timeout=900)
    try:
        yield process
    finally:
        process.stop()


def _logprobs(process, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    response = httpx.post(f"{process.base_url}/completions", timeout=300, json={
        "model": "smollm2", "prompt": prompt_ids, "max_tokens": 6, "temperature": 0.0,
        "logprobs": 0, "return_tokens_as_token_ids": True})
    response.raise_for_status()
    lp = response.json()["choices"][0]["logprobs"]
    return [int(t.removeprefix("token_id:")) for t in lp["tokens"]], [float(x) for x in lp["token_logprobs"]]


def _worker_checksums(process) -> list[dict]:
    answer = httpx.post(f"{process.root_url}/collective_rpc", timeout=300,
                        json={"method": "atropos_delta_checksums"})
    answer.raise_for_status()
    return answer.json()["results"]


def test_twenty_delta_syncs_match_the_trainer_bit_for_bit_and_serve_full_sync_logprobs(
        bf16_vllm, bundled_model_dir, tmp_path, capsys):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    prompt_ids = AutoTokenizer.from_pretrained(bundled_model_dir)(PROMPT).input_ids
    start = _logprobs(bf16_vllm, prompt_ids)
    weights = load_file(str(bundled_model_dir / "model.safetensors"))
    master = {n: t.float().clone() for n, t in weights.items()
              if n.startswith(BLOCKS) or n == "model.norm.weight"}
    target = LocalVLLM(bf16_vllm, tmp_path / "weights")
    generator = torch.Generator().manual_seed(0)

    def step() -> dict[str, torch.Tensor]:
        for tensor in master.values():  # an Adam-sized step: every element moves by lr
            tensor.add_(torch.randn(tensor.shape, generator=generator).sign() * 2e-4)
        return {n: t.to(torch.bfloat16) for n, t in master.items()}

    first = target.push(step(), 1)
    assert first["sync/path"] == "full"
    paths, fractions = [], []
    for version in range(2, 22):
        trainer_copy = step()
        metrics = target.push(trainer_copy, version)
        paths.append(metrics["sync/path"])
        fractions.append(metrics["sync/changed_fraction"])
        assert metrics["sync/bytes"] < metrics["sync/full_bytes"]
    assert paths == ["delta"] * 20
    assert 0.0 < min(fractions) and max(fractions) < 1.0
    expected = {n: delta.checksum(t) for n, t in trainer_copy.items()}
    for worker in _worker_checksums(bf16_vllm):
        assert worker["version"] == 21
        assert worker["sha256"] == expected  # every synced tensor, bit for bit
    after_deltas = _logprobs(bf16_vllm, prompt_ids)
    assert after_deltas != start  # the updates reached the served model
    # the same weights by a full reload: the log-probs of a server that only got full syncs
    full = LocalVLLM(bf16_vllm, tmp_path / "full", encoding="full")
    assert full.push(trainer_copy, 21)["sync/path"] == "full"
    assert _logprobs(bf16_vllm, prompt_ids) == after_deltas

    # a trainer copy that drifted from vLLM's: a checksum mismatch, one warning, a full sync
    drifted = step()
    drifted["model.norm.weight"][0] += 1.0
    base = target._servers.base
    base.tensors["model.norm.weight"][0] = drifted["model.norm.weight"][0]
    base.checksums["model.norm.weight"] = delta.checksum(base.tensors["model.norm.weight"])
    capsys.readouterr()
    metrics = target.push(drifted, 22)
    assert metrics["sync/path"] == "full"
    err = capsys.readouterr().err
    assert err.count("WARNING") == 1 and bf16_vllm.root_url in err and "checksum" in err
    assert target.push(step(), 23)["sync/path"] == "delta"


def test_an_inference_node_applies_deltas_over_http_and_serves_what_a_full_push_serves(
        bundled_model_dir, tmp_path):
    """``atropos-inference-node`` (real vLLM, bf16, no shared disk): deltas reach vLLM's worker
    in-process (``collective_rpc`` with the bytes) and serve the same log-probs as a full push."""
    import os
    import subprocess
    import sys
    import time

    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from atroposlib.inference.vllm_process import find_free_port
    from atroposlib.inference.weights.node_http import NodeFleet

    port = find_free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "node.log", "wb")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(
        [sys.executable, "-m", "atroposlib.cli.inference_node", "--model", str(bundled_model_dir),
         "--port", str(port), "--dtype", "bfloat16", "--served-model-name", "smollm2",
         "--serve-base", "--weights-dir", str(tmp_path / "weights"), "--log", str(tmp_path / "vllm.log"),
         "--", "--max-model-len", "512"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
        start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        while True:
            assert proc.poll() is None, (tmp_path / "node.log").read_text()[-4000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the node did not become healthy"
            time.sleep(1)
        prompt_ids = AutoTokenizer.from_pretrained(bundled_model_dir)(PROMPT).input_ids
        weights = load_file(str(bundled_model_dir / "model.safetensors"))
        master = {n: t.float().clone() for n, t in weights.items() if n.startswith(BLOCKS)}
        generator = torch.Generator().manual_seed(1)

        def step() -> dict[str, torch.Tensor]:
            for tensor in master.values():
                tensor.add_(torch.randn(tensor.shape, generator=generator).sign() * 2e-4)
            return {n: t.clone() for n, t in master.items()}  # fp32: the fleet casts to bf16

        fleet = NodeFleet.connect([url], timeout=600)
        paths = [fleet.push(step(), v)["sync/path"] for v in range(1, 7)]
        status = httpx.get(f"{url}/atropos/status", timeout=30).json()
        last = step()
        assert fleet.push(last, 7)["sync/path"] == "delta"
        after_deltas = _node_logprobs(url, prompt_ids)
        fleet.close()
        full = NodeFleet.connect([url], timeout=600, encoding="full")
        assert full.push(last, 8)["sync/path"] == "full"
        after_full = _node_logprobs(url, prompt_ids)
        full.close()
    finally:
        proc.terminate()
        proc.wait(120)
    assert paths == ["full"] + ["delta"] * 5
    assert status["last_update"]["source"] == "delta" and status["policy_version"] == 6
    assert after_deltas == after_full


def _node_logprobs(url: str, prompt_ids: list[int]) -> list[float]:
    answer = httpx.post(f"{url}/v1/completions", timeout=300, json={
        "model": "smollm2", "prompt": prompt_ids, "max_tokens": 1, "echo": True, "logprobs": 0,
        "temperature": 0})
    answer.raise_for_status()
    return answer.json()["choices"][0]["logprobs"]["token_logprobs"][1:]
