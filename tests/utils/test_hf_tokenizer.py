"""The one tokenizer loader: loads a local directory, and a failure names the input and the fix."""

from __future__ import annotations

import pytest

from atroposlib.testing.tiny_tokenizer import make_tiny_tokenizer
from atroposlib.utils.hf_tokenizer import load_tokenizer


def test_loads_a_local_directory(tmp_path):
    make_tiny_tokenizer(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.decode(tokenizer("hi there")["input_ids"], skip_special_tokens=True).strip()


def test_missing_tokenizer_names_it_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match=r"cannot load teacher tokenizer '.*nope'.*atropos-bundled-model"):
        load_tokenizer(tmp_path / "nope", "teacher tokenizer")
