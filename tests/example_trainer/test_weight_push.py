"""The trainer's weight push to inference nodes: what it sends, to whom, and what happens when a node fails.

The nodes are the real node middleware and routes under uvicorn on 127.0.0.1, around a stand-in
vLLM engine (``tests/inference/node/conftest.py``); the e2e test runs the same against vLLM.
"""

from __future__ import annotations

import time

import httpx
import pytest

from atroposlib.errors import InferenceError
from example_trainer.config import TrainerConfig
from example_trainer.vllm_sync import VLLMSync
from tests.fixtures.app_thread import AppThread
from tests.inference.node.conftest import KEY, FakeServer, tiny_node_model

torch = pytest.importorskip("torch")


@pytest.fixture
def tiny_model(tmp_path):
    """A 2-layer Llama with only its last layer (and the final norm) trainable, saved as the nodes' model."""
    model, folder = tiny_node_model(tmp_path / "model")
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.25)  # "trained"
    return model, folder


def start_nodes(tmp_path, model_dir, count: int, **settings):
    servers = [FakeServer(tmp_path / f"node{i}", model_dir=model_dir, **settings) for i in range(count)]
    for i, server in enumerate(servers):
        (tmp_path / f"node{i}").mkdir(exist_ok=True)
        server.thread = AppThread(server.app)
    return servers


def sync_for(tmp_path, model_dir, servers, **overrides) -> VLLMSync:
    config = TrainerConfig(**{"model": str(model_dir), "vllm_api_key": KEY, "train_last_layers": 1,
                              "vllm_url": ",".join(f"{s.thread.url}/v1" for s in servers),
                              "vllm_start_timeout": 30, **overrides})
    sync = VLLMSync(config, tmp_path / "run")
    sync.start()
    return sync


def served(server) -> dict:
    return server.engine.weights


def test_http_push_sends_the_trained_blocks_in_the_nodes_dtype_to_every_node(tmp_path, tiny_model):
    model, model_dir = tiny_model
    servers = start_nodes(tmp_path, model_dir, 2)
    try:
        sync = sync_for(tmp_path, model_dir, servers, weight_transport="http")
        metrics = sync.sync(model, None, version=3)
        answers = [httpx.post(f"{s.thread.url}/v1/completions", json={}, headers={"Authorization": f"Bearer {KEY}"})
                   for s in servers]
        sync.stop()
    finally:
        for server in servers:
            server.thread.stop()
    state = model.state_dict()
    for server, answer in zip(servers, answers, strict=True):
        weights = served(server)
        assert answer.headers["X-Atropos-Policy-Version"] == "3"
        for name in ("model.layers.1.mlp.up_proj.weight", "model.norm.weight"):
            assert torch.equal(torch.from_numpy(weights[name]), state[name])  # trained: sent
        assert server.state.last_update.tensors == 10  # layer 1 (9 tensors) + the final norm
        assert server.state.last_update.source == "http"
    assert metrics["sync/nodes_ok"] == 2 and metrics["sync/nodes_failed"] == 0
    assert metrics["sync/bytes_sent"] == 2 * servers[0].state.last_update.bytes
    assert sync.summary() == {"weight_sync_failures": 0, "stale_nodes": [],
                              "weight_sync_paths": {s.thread.url: "http" for s in servers}}


def test_a_node_on_this_host_that_sees_the_run_directory_reads_the_weights_from_it(tmp_path, tiny_model, capsys):
    model, model_dir = tiny_model
    servers = start_nodes(tmp_path, model_dir, 1)
    try:
        sync = sync_for(tmp_path, model_dir, servers)  # --weight-transport auto
        metrics = sync.sync(model, None, version=1)
        sync.stop()
    finally:
        servers[0].thread.stop()
    assert "same host, reads the run directory -> weights by local file" in capsys.readouterr().out
    assert servers[0].state.last_update.source == "path"
    assert metrics["sync/bytes_sent"] == 0
    assert (tmp_path / "run" / "vllm_weights" / "model.safetensors").exists()


def test_a_slow_node_is_marked_stale_with_one_warning_and_training_does_not_wait(tmp_path, tiny_model, capsys):
    model, model_dir = tiny_model
    servers = start_nodes(tmp_path, model_dir, 2)
    servers[1].engine.reload_delay = 4.0
    try:
        sync = sync_for(tmp_path, model_dir, servers, weight_transport="http", weight_sync_timeout=1.0)
        sync.fleet._stop.set()  # no re-sync in this test
        first = sync.sync(model, None, version=1)
        still_loading = servers[1].state.state  # the trainer went on without waiting for it
        second = sync.sync(model, None, version=2)
        summary = sync.summary()
        sync.stop()
    finally:
        for server in servers:
            server.thread.stop()
    err = capsys.readouterr().err
    assert err.count("WARNING") == 1
    assert f"inference node {servers[1].thread.url} missed the weight sync to policy version 1" in err
    assert "no answer within --weight-sync-timeout 1 s" in err and "--weight-sync-timeout" in err
    assert first["sync/nodes_failed"] == 1 and second["sync/nodes_failed"] == 1
    assert still_loading == "applying"
    assert summary["weight_sync_failures"] == 2 and summary["stale_nodes"] == [servers[1].thread.url]
    assert servers[0].state.version == 2


def _restart_node(tmp_path, model_dir, port: int) -> FakeServer:
    """A fresh node (no weights) on the port a stopped one used."""
    node = FakeServer(tmp_path / "node0-again", model_dir=model_dir)
    node.thread = AppThread(node.app, port=port)
    return node


def _wait_for_version(node: FakeServer, version: int, timeout: float = 30) -> None:
    """Wait until ``node`` serves ``version`` (the trainer re-sends it), at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while node.state.version != version and time.monotonic() < deadline:
        time.sleep(0.2)


def test_a_node_that_restarts_refuses_completions_until_it_is_sent_the_current_weights(tmp_path, tiny_model, capsys):
    model, model_dir = tiny_model
    first = start_nodes(tmp_path, model_dir, 1)[0]
    port = first.thread.port
    sync = sync_for(tmp_path, model_dir, [first], weight_transport="http", weight_sync_timeout=5.0)
    try:
        sync.sync(model, None, version=1)
        first.thread.stop()  # the node dies
        down = sync.sync(model, None, version=2)
        restarted = _restart_node(tmp_path, model_dir, port)
        refused = httpx.post(f"{restarted.thread.url}/v1/completions", json={},
                             headers={"Authorization": f"Bearer {KEY}"})
        _wait_for_version(restarted, 2)
        # the node applies version 2 before the fleet's re-send returns and clears the mark
        deadline = time.monotonic() + 30
        while sync.summary()["stale_nodes"] and time.monotonic() < deadline:
            time.sleep(0.1)
        summary = sync.summary()
        sync.stop()
    finally:
        for server in (first, locals().get("restarted")):
            if server is not None:
                server.thread.stop()
    assert down["sync/nodes_failed"] == 1
    assert refused.status_code == 503 and refused.headers["Retry-After"]
    assert restarted.state.version == 2 and restarted.state.state == "serving"
    assert summary["stale_nodes"] == [] and summary["weight_sync_failures"] == 1
    assert f"inference node {restarted.thread.url} is back: re-sent policy version 2" in capsys.readouterr().out


def test_a_wrong_key_or_a_mix_of_nodes_and_plain_vllm_fails_at_start(tmp_path, tiny_model):
    from fastapi import FastAPI

    model, model_dir = tiny_model
    servers = start_nodes(tmp_path, model_dir, 1)
    plain = FastAPI()
    plain.get("/health")(lambda: {})
    plain_thread = AppThread(plain)
    try:
        with pytest.raises(InferenceError, match="refused the API key.*--vllm-api-key"):
            sync_for(tmp_path, model_dir, servers, vllm_api_key="wrong")
        config = TrainerConfig(model=str(model_dir), vllm_api_key=KEY, vllm_start_timeout=30,
                               vllm_url=f"{servers[0].thread.url}/v1,{plain_thread.url}/v1")
        with pytest.raises(InferenceError, match="mixes atropos-inference-node nodes"):
            VLLMSync(config, tmp_path / "run").start()
    finally:
        servers[0].thread.stop()
        plain_thread.stop()


def test_a_node_that_restarts_between_two_syncs_is_re_sent_the_weights_without_waiting_for_one(
        tmp_path, tiny_model, capsys):
    model, model_dir = tiny_model
    first = start_nodes(tmp_path, model_dir, 1)[0]
    sync = sync_for(tmp_path, model_dir, [first], weight_transport="http")
    restarted = None
    try:
        sync.sync(model, None, version=4)
        first.thread.stop()
        restarted = _restart_node(tmp_path, model_dir, first.thread.port)
        _wait_for_version(restarted, 4)
        summary = sync.summary()
        sync.stop()
    finally:
        first.thread.stop()
        if restarted is not None:
            restarted.thread.stop()
    assert restarted.state.version == 4  # no training step needed: envs would wait on it
    assert "serves version None (awaiting_weights), not 4: it restarted? re-sending" in capsys.readouterr().out
    assert summary["weight_sync_failures"] == 0


def test_lora_runs_push_the_adapter_which_the_node_loads_in_place(tmp_path):
    import json

    from transformers import LlamaConfig, LlamaForCausalLM

    from example_trainer.lora import apply_lora

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=2, num_attention_heads=2,
                                        num_key_value_heads=2, max_position_embeddings=32))
    base.save_pretrained(tmp_path / "model")
    model = apply_lora(base, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    plain = FakeServer(tmp_path / "plain", model_dir=tmp_path / "model")
    with_lora = FakeServer(tmp_path / "lora", model_dir=tmp_path / "model", lora=True)
    for server in (plain, with_lora):
        server.settings.weights_dir.parent.mkdir(parents=True, exist_ok=True)
        server.thread = AppThread(server.app)
    try:
        sync = sync_for(tmp_path, tmp_path / "model", [with_lora], weight_sync="lora", lora_r=4,
                        train_last_layers=None, served_model_name="policy", weight_transport="http")
        metrics = sync.sync(model, None, version=2)
        sync.stop()
        with pytest.raises(InferenceError, match="run vLLM without LoRA.*--enable-lora --max-lora-rank 8"):
            sync_for(tmp_path / "again", tmp_path / "model", [plain], weight_sync="lora", lora_r=4,
                     train_last_layers=None, weight_transport="http")
    finally:
        for server in (plain, with_lora):
            server.thread.stop()
    [load] = with_lora.models.loads
    assert (load["name"], load["inplace"]) == ("policy-lora", True)
    assert json.loads(load["config"])["r"] == 4
    assert load["tensors"] and all("lora_" in name for name in load["tensors"])
    assert metrics["sync/nodes_failed"] == 0 and with_lora.state.version == 2
    assert with_lora.state.last_update.kind == "lora"
    assert plain.models.loads == []


def _train_a_little(model, elements: int = 3) -> None:
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.view(-1)[:elements] += 0.5


def test_a_node_at_the_last_version_gets_a_delta_and_one_that_refuses_it_the_full_weights(
        tmp_path, tiny_model, capsys):
    model, model_dir = tiny_model
    servers = start_nodes(tmp_path, model_dir, 2)
    try:
        sync = sync_for(tmp_path, model_dir, servers, weight_transport="http")
        first = sync.sync(model, None, version=1)
        _train_a_little(model)
        second = sync.sync(model, None, version=2)
        sources = [s.state.last_update.source for s in servers]
        servers[1].engine.delta.reset()  # node 1 lost its copy (as after a vLLM restart)
        capsys.readouterr()
        _train_a_little(model)
        third = sync.sync(model, None, version=3)
        sync.stop()
    finally:
        for server in servers:
            server.thread.stop()
    assert first["sync/path"] == "full" and first["sync/changed_fraction"] == 1.0
    assert second["sync/path"] == "delta" and sources == ["delta", "delta"]
    assert second["sync/bytes"] < second["sync/full_bytes"] / 2
    assert 0 < second["sync/changed_fraction"] < 0.5
    assert third["sync/path"] == "full" and third["sync/nodes_ok"] == 2
    err = capsys.readouterr().err
    assert err.count("WARNING") == 1 and servers[1].thread.url in err and servers[0].thread.url not in err
    assert [s.state.last_update.source for s in servers] == ["delta", "http"]
    state = model.state_dict()
    for server in servers:  # both serve the trainer's weights exactly
        assert server.state.version == 3
        for name in ("model.layers.1.mlp.up_proj.weight", "model.norm.weight"):
            assert torch.equal(torch.from_numpy(served(server)[name]), state[name])


def test_the_trainers_own_vllm_gets_full_syncs_unless_a_delta_format_is_named():
    # measured: on one host a delta costs more than the memory copy it saves (benchmarks/bench_delta_sync.py)
    from example_trainer.vllm_sync import local_encoding

    assert local_encoding("auto") == "full"
    assert [local_encoding(e) for e in ("index", "xor", "full")] == ["index", "xor", "full"]
