"""An empty API key is refused everywhere one is given (it used to turn authentication off)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from atroposlib.api.client import AsyncAtroposClient, AtroposClient
from atroposlib.api.settings import ApiSettings
from example_trainer.config import TrainerConfig

RUN_API = [sys.executable, "-m", "atroposlib.cli.run_api", "--port", "1"]


@pytest.mark.parametrize("value", ["", "  "])
def test_run_api_refuses_an_empty_api_key_flag(value: str) -> None:
    done = subprocess.run([*RUN_API, "--api-key", value], capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in os.environ.items()
                                           if k != "ATROPOS_API_KEY"})
    assert done.returncode == 2, done.stderr
    assert "--api-key is empty" in done.stderr


def test_run_api_refuses_a_set_but_empty_environment_key() -> None:
    done = subprocess.run(RUN_API, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "ATROPOS_API_KEY": ""})
    assert done.returncode == 2, done.stderr
    assert "$ATROPOS_API_KEY is set but empty" in done.stderr


def test_settings_clients_and_trainer_refuse_an_empty_key() -> None:
    with pytest.raises(ValidationError, match="--api-key is empty"):
        ApiSettings(api_key="")
    for client in (AtroposClient, AsyncAtroposClient):
        with pytest.raises(ValueError, match="api_key is empty"):
            client("http://127.0.0.1:1", api_key="")
    with pytest.raises(ValidationError, match="api_key"):
        TrainerConfig(api_key="")
    assert ApiSettings(api_key="k").api_key_value() == "k"


@pytest.mark.parametrize("module", ["atroposlib.cli.sft", "atroposlib.cli.view_run"])
def test_tool_flags_refuse_an_empty_key(module: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, "--api-key", ""], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "the token is empty" in done.stderr, done.stderr
