"""A stand-in for vLLM's engine client and server, so the node's gate, routes and updates run without vLLM.

``FakeEngineClient`` implements the few ``EngineClient`` methods the node calls (pause, resume,
``collective_rpc("reload_weights")`` and the discard after a failed one, prefix-cache reset,
weight version, LoRA load) and keeps the loaded tensors, so a test can read what "vLLM" serves. ``node_app`` wraps a tiny Starlette app
(``POST /v1/completions`` answering, OpenAI-style, with a checksum of the loaded weights as text) in the real
:class:`NodeMiddleware`, exactly as vLLM's server does with ``--middleware``.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import load_file, save, save_file
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from atroposlib.inference.node.middleware import NodeMiddleware
from atroposlib.inference.node.models import content_digest
from atroposlib.inference.node.settings import NodeSettings
from atroposlib.inference.node.state import NodeState
from atroposlib.inference.weights.delta_cache import DeltaCache
from atroposlib.inference.worker_extension import (
    DELTA_APPLY_RPC,
    DELTA_RESET_RPC,
    DELTA_SEED_RPC,
    DISCARD_PARTIAL_RELOAD_RPC,
)

KEY = "node-s3cret"



def tiny_node_model(folder: Path):
    """A 2-layer tiny Llama saved to ``folder`` as a node's model, its last layer (and the final
    norm) left trainable as the trainer leaves it: ``(model, folder)``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from example_trainer.grpo import freeze_all_but_last_layers

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=2, max_position_embeddings=32,
                                         tie_word_embeddings=True))
    model.save_pretrained(folder)
    freeze_all_but_last_layers(model, 1)
    return model, folder

def base_tensors() -> dict[str, np.ndarray]:
    """The stand-in model: two 'layers' and a final norm."""
    return {"model.layers.0.w": np.zeros((2, 3), np.float32),
            "model.layers.1.w": np.zeros((2, 3), np.float32),
            "model.norm.weight": np.ones(3, np.float32)}


def fingerprint(tensors: dict[str, np.ndarray]) -> str:
    """A short digest of tensor values (what the fake completion answers with)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode() + tensors[name].tobytes())
    return digest.hexdigest()[:16]


def push_body(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> tuple[bytes, dict[str, str]]:
    """A safetensors body and the headers the trainer sends with it."""
    body = save(tensors, metadata=metadata)
    return body, {"Content-Digest": content_digest(body), "Authorization": f"Bearer {KEY}",
                  "Content-Type": "application/octet-stream"}


class FakeEngineClient:
    """The subset of vLLM's ``AsyncLLM`` the node uses, recording every call."""

    def __init__(self, model_dir: Path):
        self.weights = load_file(model_dir / "model.safetensors")
        self.calls: list[str] = []
        self.fail_reload: int = 0  # fail this many reloads
        self.reload_delay = 0.0
        self.paused = False
        self.version = "default"
        self.adapters: dict[str, str] = {}
        self.model_config = SimpleNamespace(dtype="torch.float32")
        self.vllm_config = SimpleNamespace(lora_config=None)
        self.delta = DeltaCache()  # the worker extension's delta base, real
        self.deltas_enabled = True  # False: a vLLM without atroposlib's worker extension

    async def pause_generation(self, mode: str = "abort", clear_cache: bool = True) -> None:
        self.calls.append(f"pause:{mode}")
        self.paused = True

    async def resume_generation(self) -> None:
        self.calls.append("resume")
        self.paused = False

    async def collective_rpc(self, method: str, timeout=None, args=(), kwargs=None):
        if method == DISCARD_PARTIAL_RELOAD_RPC:  # what vLLM's workers run after a failed reload
            self.calls.append("discard")
            return [0]
        if method in (DELTA_SEED_RPC, DELTA_APPLY_RPC, DELTA_RESET_RPC):
            return self._delta_rpc(method, args)
        assert method == "reload_weights"
        self.calls.append("reload")
        assert self.paused, "weights reloaded while vLLM was scheduling"
        await asyncio.sleep(self.reload_delay)
        if self.fail_reload:
            self.fail_reload -= 1
            self.weights["model.layers.1.w"] = np.full((2, 3), np.nan, np.float32)  # half-written
            raise RuntimeError("worker crashed while loading")
        for file in sorted(Path(kwargs["weights_path"]).glob("*.safetensors")):
            self.weights.update(load_file(file))
        return [None]

    def _delta_rpc(self, method: str, args: tuple) -> list:
        if not self.deltas_enabled:
            raise RuntimeError(f"Method {method} not found")  # what vLLM answers without it
        self.calls.append(method)
        if method == DELTA_SEED_RPC:
            return [self.delta.seed_from_dir(args[0], int(args[1]))]
        if method == DELTA_RESET_RPC:
            self.delta.reset()
            return [None]
        assert self.paused, "delta applied while vLLM was scheduling"

        def load(pairs):
            self.weights.update({name: tensor.numpy().copy() for name, tensor in pairs})

        return [self.delta.apply(args[0], load)]

    async def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False) -> bool:
        self.calls.append("reset_prefix_cache")
        return True

    async def update_weight_version(self, new_version: str) -> None:
        self.version = new_version


class FakeServingModels:
    """vLLM's ``OpenAIServingModels.load_lora_adapter``: records each adapter loaded in place."""

    def __init__(self) -> None:
        self.loads: list[dict] = []

    async def load_lora_adapter(self, request) -> str:
        adapter = Path(request.lora_path)
        self.loads.append({"name": request.lora_name, "inplace": request.load_inplace,
                           "config": (adapter / "adapter_config.json").read_text(),
                           "tensors": sorted(load_file(adapter / "adapter_model.safetensors"))})
        return "Success"


class FakeServer:
    """A Starlette 'vLLM' with the real NodeMiddleware; ``release`` lets held completions answer."""

    def __init__(self, tmp_path: Path, model_dir: Path | None = None, lora: bool = False, **settings):
        if model_dir is None:
            model_dir = tmp_path / "model"
            model_dir.mkdir(parents=True, exist_ok=True)
            save_file(base_tensors(), model_dir / "model.safetensors")
        settings.setdefault("api_key", KEY)
        self.settings = NodeSettings(model=str(model_dir), weights_dir=tmp_path / "weights",
                                     **settings)
        self.engine = FakeEngineClient(model_dir)
        self.hold = asyncio.Event()
        self.hold.set()
        self.started = 0

        async def completions(request: Request) -> JSONResponse:
            self.started += 1
            await self.hold.wait()
            weights = fingerprint(self.engine.weights)  # what the "model" answers: its weights
            return JSONResponse({"id": "cmpl-1", "object": "text_completion", "created": 0,
                                 "model": "m", "weights": weights, "choices": [
                                     {"index": 0, "text": weights, "finish_reason": "stop",
                                      "logprobs": None}]})

        app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                                Route("/health", lambda r: JSONResponse({}))])
        app.state.engine_client = self.engine
        self.models = FakeServingModels()
        app.state.openai_serving_models = self.models
        if lora:
            self.engine.vllm_config.lora_config = SimpleNamespace(max_lora_rank=8)
        self.state = NodeState(self.settings)
        app.add_middleware(NodeMiddleware, settings=self.settings, state=self.state)
        self.app = app


@pytest.fixture
def fake_node(tmp_path) -> FakeServer:
    """A node around the fake engine, awaiting weights, API key ``KEY``."""
    return FakeServer(tmp_path)
