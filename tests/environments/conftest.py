"""Fixtures for the environment-collection tests: tiny offline tokenizer, fake-server helpers."""

from __future__ import annotations

import pytest

from atroposlib.testing.tiny_tokenizer import make_tiny_tokenizer


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory):
    """A saved tiny byte-level ChatML tokenizer (``--env.tokenizer_name DIR``)."""
    path = tmp_path_factory.mktemp("tiny_tokenizer_collection")
    make_tiny_tokenizer(path)
    return str(path)
