"""Fixtures of the tools tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.tools.groups import load_tokenizer


@pytest.fixture(scope="session")
def tokenizer(bundled_model_dir: Path) -> Any:
    return load_tokenizer(bundled_model_dir)
