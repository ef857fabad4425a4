"""The configuration reference is generated from the pydantic models (docs site and CLI)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.config_docs import generate
from atroposlib.envs.item_filter import ItemFilterConfig
from atroposlib.inference.clients.config import APIServerConfig

REPO = Path(__file__).resolve().parents[2]
CONFIG_PAGE = "reference/config.md"


def test_the_docs_config_page_is_generated_from_the_models():
    """The site's configuration reference is this generator's output, made on every docs build."""
    pytest.importorskip("mkdocs")
    from mkdocs.config import load_config
    from mkdocs.structure.files import Files

    config = load_config(str(REPO / "mkdocs.yml"))
    # the files event of the build, through every plugin and hook mkdocs.yml configures
    files = config.plugins.on_files(Files([]), config=config)
    page = files.get_file_from_path(CONFIG_PAGE)
    assert page is not None and page.content_string == generate()
    assert not (REPO / "docs" / CONFIG_PAGE).exists(), "the page is generated: do not commit a copy"
    nav_pages = re.findall(r":\s*(\S+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), re.M)
    assert CONFIG_PAGE in nav_pages


def test_every_field_default_and_description_is_documented():
    text = generate()
    for model, prefix in ((BaseEnvConfig, "env"), (ItemFilterConfig, "env.item_filter"),
                          (APIServerConfig, "openai")):
        for name, field in model.model_fields.items():
            assert f"`--{prefix}.{name}`" in text or f"`--{prefix}.{name}.<field>`" in text
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
