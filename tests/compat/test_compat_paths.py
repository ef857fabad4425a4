"""Every Atropos 0.4 import path whose code moved keeps working, through one generated table."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.compat import paths

REPO = Path(__file__).resolve().parents[2]


def test_every_stub_is_generated_from_the_table_and_short():
    assert paths.main(["--root", str(REPO)]) == 0
    for old in paths.MOVED:
        text = paths.stub_path(old, REPO).read_text()
        assert len(text.splitlines()) <= 10, old


@pytest.mark.parametrize("old", sorted(set(paths.MOVED) - paths.PACKAGES))
def test_old_path_is_the_same_module_object(old):
    # A fresh interpreter: the old path imported first, then the new one.
    code = (f"import importlib, sys; a = importlib.import_module({old!r}); "
            f"b = importlib.import_module({paths.MOVED[old]!r}); "
            f"assert a is b and sys.modules[{old!r}] is b, (a, b); print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_patching_the_old_path_patches_the_code_that_runs(monkeypatch):
    old = importlib.import_module("atroposlib.envs.server_handling.server_baseline")
    new = importlib.import_module("atroposlib.inference.clients.base")
    monkeypatch.setattr(old, "REQUEST_ATTEMPTS", 2)
    assert new.REQUEST_ATTEMPTS == 2


def test_package_stub_reexports_without_loading_modules_twice():
    code = ("import sys\nfrom atroposlib.envs.reward_fns import registry, RewardFunction\n"
            "import atroposlib.envs.reward_fns.accuracy_reward as old\n"
            "import atroposlib.rewards.accuracy_reward as new\n"
            "from atroposlib.rewards import registry as reg\n"
            "assert old is new and registry is reg, (old, new)\n"
            "assert type(registry).__name__ == 'RewardRegistry'\n"
            "assert RewardFunction is sys.modules['atroposlib.rewards.reward_function'].RewardFunction\n"
            "print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_stale_stub_is_reported(tmp_path):
    paths.main(["--root", str(tmp_path), "--write"])
    victim = paths.stub_path("atroposlib.envs.server_handling.vllm_server", tmp_path)
    victim.write_text(victim.read_text() + "# edited by hand\n")
    assert paths.main(["--root", str(tmp_path)]) == 1
