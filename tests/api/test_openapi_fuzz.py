"""The OpenAPI document matches what a live run-api does: Schemathesis, every check and phase.

Schemathesis generates requests from ``/openapi.json`` (valid and invalid ones, then sequences
of calls) and checks each answer: no 5xx, only documented status codes, bodies and headers as
documented, invalid data refused, valid data accepted (see ``schemathesis.toml`` for the two
rules JSON Schema cannot express). A bounded number of examples keeps it to about a minute.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.api_server import start_run_api

pytest.importorskip("schemathesis")

CONFIG = Path(__file__).with_name("schemathesis.toml")
MAX_EXAMPLES = 30


def server_errors(har_dir: Path) -> list[str]:
    """``METHOD path -> status`` for every 5xx answer recorded in the HAR report(s)."""
    found = []
    for har in har_dir.glob("*.json"):
        for entry in json.loads(har.read_text())["log"]["entries"]:
            if entry["response"]["status"] >= 500:
                request = entry["request"]
                found.append(f"{request['method']} {request['url']} -> {entry['response']['status']}")
    return found


@pytest.mark.timeout(400)
def test_schemathesis_finds_nothing_on_a_live_server(tmp_path: Path) -> None:
    api = start_run_api()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG), "run",
             f"{api.url}/openapi.json", "--checks", "all", "--max-examples", str(MAX_EXAMPLES),
             "--seed", "1", "--generation-database", "none", "--workers", "1",
             "--continue-on-failure", "--report", "har", "--report-dir", str(tmp_path / "report"),
             "--request-timeout", "30"],
            capture_output=True, text=True, timeout=360, check=False,
            cwd=tmp_path,  # Schemathesis keeps a .schemathesis/ folder in the working directory
        )
    finally:
        api.stop()
    output = result.stdout[-8000:] + result.stderr[-2000:]
    assert server_errors(tmp_path / "report") == [], output
    assert result.returncode == 0, output
    assert "Traceback" not in api.log(), api.log()[-4000:]
