"""The node client as public API: docs/inference-node.md's "Push from your own trainer" example runs.

The node is the real node middleware and routes under uvicorn on 127.0.0.1, around the stand-in
vLLM engine of ``tests/inference/node/conftest.py``; the model is a tiny Llama with its last
decoder block trainable, saved as the node's starting checkpoint.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from atroposlib.errors import InferenceError
from tests.fixtures.app_thread import AppThread
from tests.inference.node.conftest import KEY, FakeServer, tiny_node_model

torch = pytest.importorskip("torch")

DOC = Path(__file__).resolve().parents[3] / "docs" / "inference-node.md"


def _example() -> str:
    text = DOC.read_text()
    section = text[text.index("## Push from your own trainer"):]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


@pytest.fixture
def tiny_model(tmp_path):
    return tiny_node_model(tmp_path / "model")


@pytest.fixture
def node(tmp_path, tiny_model):
    server = FakeServer(tmp_path / "node", model_dir=tiny_model[1])
    (tmp_path / "node").mkdir(exist_ok=True)
    server.thread = AppThread(server.app)
    yield server
    server.thread.stop()


def test_the_documented_example_keeps_a_node_on_the_trainers_weights(node, tiny_model, monkeypatch):
    model, _ = tiny_model
    monkeypatch.setenv("ATROPOS_API_KEY", KEY)

    def train_one_step(m):
        with torch.no_grad():
            for param in m.parameters():
                if param.requires_grad:
                    param.add_(0.125)

    code = _example()
    assert len(code.splitlines()) <= 25, "the example should stay a few lines"
    exec(compile(code, str(DOC), "exec"), {"NODE_URL": f"{node.thread.url}/v1", "model": model,
                                           "train_one_step": train_one_step})

    answer = httpx.post(f"{node.thread.url}/v1/completions", json={},
                        headers={"Authorization": f"Bearer {KEY}"})
    assert answer.headers["X-Atropos-Policy-Version"] == "3"
    served, state = node.engine.weights, model.state_dict()
    for name in ("model.layers.1.mlp.up_proj.weight", "model.layers.1.self_attn.q_proj.weight",
                 "model.norm.weight"):
        assert torch.equal(torch.from_numpy(served[name]), state[name])  # trained 3 times: sent
    assert node.state.last_update.tensors == 10  # block 1 (9 tensors) and the final norm
    assert node.state.last_update.source == "delta"  # pushes after the first: the changes only


def test_connect_refuses_what_is_not_a_node_and_a_wrong_key(node):
    from fastapi import FastAPI

    from atroposlib.inference.weights.node_http import NodeFleet

    plain = FastAPI()
    plain.get("/health")(lambda: {})
    plain_thread = AppThread(plain)
    try:
        with pytest.raises(InferenceError, match="not an atropos-inference-node"):
            NodeFleet.connect([plain_thread.url], api_key=KEY)
        with pytest.raises(InferenceError, match="refused the API key"):
            NodeFleet.connect([node.thread.url], api_key="wrong")
        with pytest.raises(InferenceError, match="without LoRA.*--enable-lora"):
            NodeFleet.connect([node.thread.url], api_key=KEY, lora_name="policy-lora")
    finally:
        plain_thread.stop()


def test_a_lora_push_without_its_adapter_config_is_refused_before_anything_is_sent(tmp_path):
    from atroposlib.inference.weights.node_http import Node, NodeFleet

    fleet = NodeFleet([Node("http://127.0.0.1:9", "http", "float32", lora_enabled=True)], None, 5.0,
                      lora_name="policy-lora")
    with pytest.raises(ValueError, match="a LoRA push needs metadata"):
        fleet.push({"a.lora_A.weight": torch.zeros(2, 2)}, version=1)
    fleet.close()
