"""CONFIG.md is generated from the pydantic models and must not go stale."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.config_docs import generate
from atroposlib.inference.clients.config import APIServerConfig

REPO = Path(__file__).resolve().parents[2]


def test_config_md_is_up_to_date():
    committed = (REPO / "CONFIG.md").read_text()
    assert committed == generate(), (
        "CONFIG.md is stale: run `make config-docs` (python -m atroposlib.envs.config_docs > CONFIG.md)"
    )


def test_every_field_default_and_description_is_documented():
    text = generate()
    for model, prefix in ((BaseEnvConfig, "env"), (APIServerConfig, "openai")):
        for name, field in model.model_fields.items():
            assert f"`--{prefix}.{name}`" in text
            assert field.description and field.description.split(".")[0][:30] in text


def test_module_prints_the_document():
    out = subprocess.run([sys.executable, "-m", "atroposlib.envs.config_docs"],
                         capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out == generate()


def test_tokenizer_default_is_the_local_bundled_model_not_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.setenv("ATROPOS_CACHE_DIR", str(tmp_path))
    from atroposlib.inference.bundled import bundled_model_dir

    assert BaseEnvConfig().tokenizer_name == str(bundled_model_dir())
    assert str(tmp_path) in BaseEnvConfig().tokenizer_name
    assert BaseEnvConfig(tokenizer_name="/some/dir").tokenizer_name == "/some/dir"
