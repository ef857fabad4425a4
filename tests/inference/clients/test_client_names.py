"""The inference clients are called clients; Atropos 0.4's ``*Server`` names stay as aliases."""

from __future__ import annotations

import importlib

import pytest

ALIASES = [
    ("atroposlib.inference.clients.base", "InferenceClient", "APIServer"),
    ("atroposlib.inference.clients.openai_client", "OpenAIClient", "OpenAIServer"),
    ("atroposlib.inference.clients.vllm_client", "VLLMClient", "VLLMServer"),
    ("atroposlib.inference.clients.sglang_client", "SGLangClient", "SGLangServer"),
    ("atroposlib.inference.clients.trl_vllm_client", "TrlVllmClient", "TrlVllmServer"),
]


@pytest.mark.parametrize(("module", "new", "old"), ALIASES)
def test_old_server_names_are_the_client_classes(module, new, old):
    mod = importlib.import_module(module)
    assert getattr(mod, old) is getattr(mod, new) and old in mod.__all__ and new in mod.__all__
    old_path = module.replace("atroposlib.inference.clients.", "atroposlib.envs.server_handling.")
    old_path = {"base": "server_baseline"}.get(old_path.rsplit(".", 1)[1], old_path.rsplit(".", 1)[1])
    old_path = old_path.replace("_client", "_server")
    aliased = importlib.import_module(f"atroposlib.envs.server_handling.{old_path}")
    assert getattr(aliased, old) is getattr(mod, new)


def test_server_type_picks_a_client_class():
    from atroposlib.inference.clients.manager import server_class_for
    from atroposlib.inference.clients.vllm_client import VLLMClient

    assert server_class_for("vllm") is VLLMClient
    from atroposlib.envs.base import APIServer, BaseEnv
    from atroposlib.inference.clients.base import InferenceClient

    assert APIServer is InferenceClient is BaseEnv.server_cls
