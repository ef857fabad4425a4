"""Fixtures for env-runtime tests: a tiny offline tokenizer and a scripted fake server."""

from __future__ import annotations

import pytest

from atroposlib.testing.tiny_tokenizer import make_tiny_tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """A saved tiny byte-level ChatML tokenizer (usable as --env.tokenizer_name DIR)."""
    path = tmp_path_factory.mktemp("tiny_tokenizer")
    make_tiny_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
