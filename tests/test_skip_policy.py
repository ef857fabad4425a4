"""The suite's skip policy: only a missing CUDA GPU or chromium may skip; every other skip fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SUITE = '''
import pytest

def test_runs():
    assert True

def test_needs_gpu():
    pytest.skip("needs a CUDA GPU")

@pytest.mark.skipif(True, reason="Debian chromium is not installed")
def test_needs_chromium():
    pass

@pytest.mark.skipif(True, reason="bundled model not prepared (atropos-bundled-model)")
def test_cold_cache():
    pass

@pytest.fixture
def server():
    pytest.skip("vLLM is not installed")

def test_fixture_skip(server):
    pass

@pytest.mark.xfail(reason="known bug")
def test_expected_failure():
    assert False
'''


def _run(tmp_path: Path, source: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.fixtures.skip_policy", "-p", "no:cacheprovider",
         "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True, text=True, timeout=120)


def test_only_allowlisted_skips_pass_and_all_are_listed(tmp_path):
    proc = _run(tmp_path, SUITE)
    out = proc.stdout
    assert proc.returncode == 1, out
    assert "1 passed, 2 skipped, 1 xfailed, 2 errors" in out, out
    assert "bundled model not prepared" in out and "Make the test prepare what it needs" in out
    section = out.split("skip policy", 1)[1]
    assert "allowed    1  no CUDA GPU: needs a CUDA GPU" in section
    assert "allowed    1  no chromium (CI installs it)" in section
    assert "REFUSED       test_sample.py::test_cold_cache" in section
    assert "REFUSED       test_sample.py::test_fixture_skip: vLLM is not installed" in section


def test_a_module_level_skip_is_a_collection_error(tmp_path):
    proc = _run(tmp_path, 'import pytest\npytest.importorskip("no_such_module_anywhere")\n'
                          'def test_x():\n    pass\n')
    assert proc.returncode != 0, proc.stdout
    assert "1 error" in proc.stdout and "no_such_module_anywhere" in proc.stdout, proc.stdout


def test_a_clean_suite_passes_with_no_policy_section(tmp_path):
    proc = _run(tmp_path, "def test_x():\n    pass\n")
    assert proc.returncode == 0 and "skip policy" not in proc.stdout, proc.stdout


def test_external_vllm_skips_are_allowed_only_while_its_variable_is_set(tmp_path):
    source = ('import pytest\ndef test_x():\n'
              '    pytest.skip("vllm_server is an external server (ATROPOS_TEST_VLLM_URL); not changing it")\n')
    assert _run(tmp_path, source, {"ATROPOS_TEST_VLLM_URL": ""}).returncode == 1
    assert _run(tmp_path, source, {"ATROPOS_TEST_VLLM_URL": "http://127.0.0.1:1/v1"}).returncode == 0
