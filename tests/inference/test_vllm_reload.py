"""Real vLLM (e2e): served log-probs equal HF fp32, hot weight reload changes them, restart works."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from atroposlib.inference.vllm_log import PARTIAL_RELOAD_NOTE, STARTUP_NOTE

pytestmark = pytest.mark.e2e

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def _greedy(server, prompt_ids: list[int], max_tokens: int = 6) -> tuple[list[int], list[float]]:
    """Greedy tokens and their sampler log-probs, exact ids via return_tokens_as_token_ids."""
    response = httpx.post(
        server.base_url + "/completions",
        json={
            "model": server.model_name,
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
        },
        timeout=300,
    )
    response.raise_for_status()
    logprobs = response.json()["choices"][0]["logprobs"]
    tokens = [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]
    return tokens, [float(x) for x in logprobs["token_logprobs"]]


def _hf_logprobs(model_dir, prompt_ids: list[int], tokens: list[int], scale_norm: float = 1.0):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(scale_norm)
        ids = torch.tensor([prompt_ids + tokens])
        logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
    return [logp[len(prompt_ids) - 1 + i, t].item() for i, t in enumerate(tokens)]


@pytest.fixture(scope="module")
def prompt_ids(bundled_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_model_dir)(PROMPT).input_ids


@pytest.fixture
def perturbed_dir(bundled_model_dir, tmp_path):
    """The bundled weights with the final RMSNorm scaled by 0.5 (flatter next-token distribution)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(bundled_model_dir / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"] * 0.5
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(bundled_model_dir / "config.json", tmp_path / "config.json")
    return tmp_path


def _own_process(vllm_server):
    if vllm_server.process is None:
        pytest.skip("vllm_server is an external server (ATROPOS_TEST_VLLM_URL); not changing it")
    return vllm_server.process


def _serve_the_bundled_weights_again(vllm_server) -> None:
    """Reload the starting weights through the server's own routes (works for an external server)."""
    httpx.post(f"{vllm_server.root_url}/collective_rpc", timeout=300,
               json={"method": "reload_weights", "kwargs": {"weights_path": str(vllm_server.model_dir)}})
    httpx.post(f"{vllm_server.root_url}/reset_prefix_cache", timeout=60)


def _assert_serves_the_halved_norm(vllm_server, prompt_ids) -> None:
    """vLLM's greedy log-probs are HF's for the bundled model with its final norm scaled by 0.5."""
    tokens, served = _greedy(vllm_server, prompt_ids)
    expected = _hf_logprobs(vllm_server.model_dir, prompt_ids, tokens, scale_norm=0.5)
    assert max(abs(a - b) for a, b in zip(served, expected, strict=True)) < 1e-3


def test_fp32_logprobs_match_transformers(vllm_server, prompt_ids):
    tokens, logprobs = _greedy(vllm_server, prompt_ids)
    expected = _hf_logprobs(vllm_server.model_dir, prompt_ids, tokens)
    assert len(tokens) == 6
    assert max(abs(a - b) for a, b in zip(logprobs, expected, strict=True)) < 1e-3


def test_reload_weights_changes_generations_and_restores(vllm_server, prompt_ids, perturbed_dir):
    process = _own_process(vllm_server)
    tokens, before = _greedy(vllm_server, prompt_ids)
    try:
        seconds = process.reload_weights(perturbed_dir)
        assert 0 < seconds < 120
        # our worker extension ran in vLLM's worker and gave its free heap back
        assert isinstance(process.heap_released_bytes, int) and process.heap_released_bytes >= 0
        new_tokens, after = _greedy(vllm_server, prompt_ids, max_tokens=len(tokens))
        # The served policy is now the perturbed one: its log-probs are what HF computes for it.
        expected = _hf_logprobs(vllm_server.model_dir, prompt_ids, new_tokens, scale_norm=0.5)
        assert max(abs(a - b) for a, b in zip(after, expected, strict=True)) < 1e-3
        assert max(abs(a - b) for a, b in zip(after, before, strict=False)) > 0.05
    finally:
        process.reload_weights(vllm_server.model_dir)
    restored_tokens, restored = _greedy(vllm_server, prompt_ids)
    assert restored_tokens == tokens
    assert max(abs(a - b) for a, b in zip(restored, before, strict=True)) < 1e-4


def test_restart_serves_the_same_model_on_the_same_url(vllm_server, prompt_ids):
    process = _own_process(vllm_server)
    base_url = process.base_url
    tokens, before = _greedy(vllm_server, prompt_ids)
    seconds = process.restart(timeout=600)
    assert seconds > 0 and process.is_running() and process.base_url == base_url
    assert httpx.get(process.root_url + "/health").status_code == 200
    after_tokens, after = _greedy(vllm_server, prompt_ids)
    assert after_tokens == tokens
    assert max(abs(a - b) for a, b in zip(after, before, strict=True)) < 1e-4


def _prefix_cache_counter(server, name: str) -> float:
    text = httpx.get(server.base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(f"vllm:{name}") and not line.startswith("#"))


def test_group_rollouts_share_the_prompts_kv(vllm_server):
    """n=8 rollouts of one ~48-token prompt reuse its cached KV blocks (CPU: 32-token blocks).

    With vLLM's CPU default of 128-token blocks no block of so short a prompt is ever full, so
    every rollout of a group prefilled the prompt again: 0 cache hits.
    """
    _own_process(vllm_server)  # an external server's block size is not ours to know
    prompt = PROMPT.replace("What is the capital of France?",
                            "Add 123 and 456, then subtract 78, then multiply by 2. "
                            "Show the result as a single number, nothing else.")
    hits = _prefix_cache_counter(vllm_server, "prefix_cache_hits")
    response = httpx.post(vllm_server.base_url + "/completions", timeout=300, json={
        "model": vllm_server.model_name, "prompt": prompt, "n": 8, "max_tokens": 2,
        "temperature": 1.0})
    response.raise_for_status()
    assert len(response.json()["choices"]) == 8
    assert _prefix_cache_counter(vllm_server, "prefix_cache_hits") - hits >= 7 * 32


def test_background_sync_serves_the_weights_of_the_moment_it_was_called(vllm_server, prompt_ids,
                                                                       tmp_path):
    """``VLLMSync.sync(background=True)``: vLLM gets a snapshot; later in-place updates miss it."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from example_trainer.config import TrainerConfig
    from example_trainer.vllm_sync import VLLMSync

    model = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    config = TrainerConfig(model=str(vllm_server.model_dir), vllm_url=vllm_server.base_url,
                           weight_sync="reload", vllm_dtype="float32", weight_sync_overlap=True)
    sync = VLLMSync(config, tmp_path)
    try:
        with torch.no_grad():
            model.model.norm.weight.mul_(0.5)
        first = sync.sync(model, tokenizer, background=True)
        assert first["sync/update_seconds"] == 0.0 and "sync/wait_seconds" in first
        with torch.no_grad():  # the optimizer's next step, while the sync is in flight
            model.model.norm.weight.mul_(0.0)
        done = sync.wait()
        assert done["sync/save_seconds"] > 0 and done["sync/update_seconds"] > 0
        assert sync.wait() == {}
        _assert_serves_the_halved_norm(vllm_server, prompt_ids)
    finally:
        sync.stop()
        _serve_the_bundled_weights_again(vllm_server)


def test_both_sync_paths_report_the_heap_vllm_gave_back(vllm_server, tmp_path):
    """A reload of the trainer's own vLLM logs ``sync/vllm_heap_released_mb``, in the foreground
    sync's metrics and in the background one's (returned by the next ``sync`` or ``wait``)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from example_trainer.config import TrainerConfig
    from example_trainer.vllm_sync import VLLMSync

    process = _own_process(vllm_server)
    model = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    config = TrainerConfig(model=str(vllm_server.model_dir), weight_sync="reload", vllm_dtype="float32")
    sync = VLLMSync(config, tmp_path)
    sync.process = process  # the server the trainer would have launched (stop() is not called)
    try:
        foreground = sync.sync(model, tokenizer)
        assert foreground["sync/vllm_heap_released_mb"] >= 0
        sync.sync(model, tokenizer, background=True)
        background = sync.wait()
        assert background["sync/vllm_heap_released_mb"] >= 0 and background["sync/update_seconds"] > 0
    finally:
        sync.background.close()
        _serve_the_bundled_weights_again(vllm_server)


def test_partial_sync_writes_the_trained_tensors_and_vllm_keeps_the_frozen_ones(
        vllm_server, prompt_ids, tmp_path):
    """After one full sync, ``VLLMSync`` writes only the trained layers; vLLM then serves the
    policy with those layers new and every frozen one as it was."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from example_trainer.config import TrainerConfig
    from example_trainer.grpo import freeze_all_but_last_layers
    from example_trainer.vllm_sync import VLLMSync

    model = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32)
    freeze_all_but_last_layers(model, 2)
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    config = TrainerConfig(model=str(vllm_server.model_dir), vllm_url=vllm_server.base_url,
                           weight_sync="reload", vllm_dtype="float32")
    sync = VLLMSync(config, tmp_path)
    written = tmp_path / "vllm_weights" / "model.safetensors"
    try:
        sync.sync(model, tokenizer)  # an external server: the first sync writes everything
        assert "model.embed_tokens.weight" in load_file(written)
        with torch.no_grad():  # a "training step": only trainable tensors change
            model.model.norm.weight.mul_(0.5)
        sync.sync(model, tokenizer)
        names = set(load_file(written))
        assert names == {n for n, p in model.named_parameters() if p.requires_grad}
        assert all(n.startswith(("model.layers.28.", "model.layers.29.", "model.norm.")) for n in names)
        _assert_serves_the_halved_norm(vllm_server, prompt_ids)
        if vllm_server.process is not None:  # vLLM's per-layer warning for the frozen layers is hidden
            log = Path(vllm_server.process.log_path).read_text(errors="replace")
            assert "Failed to load weights" not in log and "were not loaded from checkpoint" not in log
            assert PARTIAL_RELOAD_NOTE.split("%d")[1] in log and STARTUP_NOTE in log
            assert "Enforce eager set" not in log and "Triton is not installed" not in log
    finally:
        sync.stop()
        _serve_the_bundled_weights_again(vllm_server)
