"""Every Atropos 0.4 import path whose code moved keeps working, through one table and one hook."""

from __future__ import annotations

import importlib
import importlib.machinery
import pickle
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import atroposlib.rewards
from atroposlib.compat import aliases

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_NAMES = Path(__file__).with_name("upstream_names.txt")

#: Every old module path: the table's, and the submodules of an old package (``reward_fns``).
OLD_PATHS = sorted(set(aliases.MOVED) | {
    f"atroposlib.envs.reward_fns.{info.name}" for info in pkgutil.iter_modules(atroposlib.rewards.__path__)})


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def test_no_old_path_has_a_file_of_its_own():
    """The table is the only place an old path is spelled: no stub file is left behind."""
    for old in OLD_PATHS:
        rel = Path(*old.split("."))
        assert not (REPO / rel.with_suffix(".py")).exists() and not (REPO / rel).exists(), old


@pytest.mark.parametrize("old", OLD_PATHS)
def test_old_path_is_the_same_module_object(old):
    # A fresh interpreter: the old path imported first, then the new one.
    new = aliases.target(old)
    code = (f"import importlib, sys; a = importlib.import_module({old!r}); "
            f"b = importlib.import_module({new!r}); "
            f"assert a is b and sys.modules[{old!r}] is b, (a, b); "
            f"assert b.__spec__.name == b.__name__ == {new!r}, b.__spec__; print('ok')")
    proc = _run(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_the_module_keeps_its_own_identity():
    """``__spec__``, ``__loader__``, ``reload``, source and pickles all name the new module."""
    old = importlib.import_module("atroposlib.envs.server_handling.vllm_server")
    new = importlib.import_module("atroposlib.inference.clients.vllm_client")
    assert old is new and new.__spec__.name == "atroposlib.inference.clients.vllm_client"
    # a source loader: importlib's own, or a subclass an import hook installed (verifiers'
    # dependencies install beartype's when the adapter tests ran first)
    assert isinstance(new.__loader__, importlib.machinery.SourceFileLoader)
    assert "class VLLMClient" in __import__("inspect").getsource(old)
    cls = old.VLLMServer
    assert pickle.loads(pickle.dumps(cls)) is cls and cls.__module__ == new.__name__
    # reload in a child: in this process it would make new class objects, and the classes
    # other tests imported would stop matching the instances the code creates
    code = ("import importlib; old = importlib.import_module('atroposlib.envs.server_handling.vllm_server'); "
            "new = importlib.import_module('atroposlib.inference.clients.vllm_client'); "
            "assert importlib.reload(old) is new; print('ok')")
    proc = _run(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_patching_the_old_path_patches_the_code_that_runs(monkeypatch):
    old = importlib.import_module("atroposlib.envs.server_handling.server_baseline")
    new = importlib.import_module("atroposlib.inference.clients.base")
    monkeypatch.setattr(old, "REQUEST_ATTEMPTS", 2)
    assert new.REQUEST_ATTEMPTS == 2
    monkeypatch.setattr("atroposlib.envs.server_handling.server_baseline.REQUEST_ATTEMPTS", 3)
    assert new.REQUEST_ATTEMPTS == 3


def test_old_package_is_the_new_package_without_loading_modules_twice():
    code = ("import sys\nfrom atroposlib.envs.reward_fns import registry, RewardFunction\n"
            "import atroposlib.envs.reward_fns.accuracy_reward as old\n"
            "import atroposlib.rewards.accuracy_reward as new\n"
            "from atroposlib.rewards import registry as reg\n"
            "import atroposlib.envs.reward_fns.registry\n"
            "assert old is new and registry is reg, (old, new)\n"
            "assert type(registry).__name__ == 'RewardRegistry'\n"
            "assert type(sys.modules['atroposlib.rewards'].registry).__name__ == 'RewardRegistry'\n"
            "assert RewardFunction is sys.modules['atroposlib.rewards.reward_function'].RewardFunction\n"
            "assert sys.modules['atroposlib.envs.reward_fns'] is sys.modules['atroposlib.rewards']\n"
            "print('ok')")
    proc = _run(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_a_missing_module_under_an_old_package_is_not_found():
    with pytest.raises(ModuleNotFoundError, match="atroposlib.envs.reward_fns.no_such_reward"):
        importlib.import_module("atroposlib.envs.reward_fns.no_such_reward")
    with pytest.raises(ModuleNotFoundError, match="atroposlib.envs.server_handling.no_such"):
        importlib.import_module("atroposlib.envs.server_handling.no_such")


def test_python_dash_m_on_the_old_path_runs_the_new_module():
    proc = subprocess.run([sys.executable, "-m", "atroposlib.envs.server_handling.managed_server_proxy",
                           "--help"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0 and "--config" in proc.stdout, proc.stderr[-2000:]


def test_names_load_on_first_use_only():
    code = ("import sys\nimport atroposlib.envs.base as base\n"
            "import atroposlib.envs.server_handling.openai_server as server\n"
            "assert 'rich' not in sys.modules and 'openai.types.completion' not in sys.modules\n"
            "from atroposlib.envs.base import rprint\n"
            "from atroposlib.envs.server_handling.openai_server import Completion\n"
            "assert rprint is sys.modules['rich'].print and vars(base)['rprint'] is rprint\n"
            "assert Completion is sys.modules['openai.types.completion'].Completion\n"
            "print('ok')")
    proc = _run(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_an_unknown_name_is_the_usual_attribute_error():
    server = importlib.import_module("atroposlib.envs.server_handling.openai_server")
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        server.NoSuchName  # noqa: B018


def test_every_module_of_the_names_table_is_an_upstream_module():
    """The names table speaks of upstream's modules, by upstream's paths."""
    upstream = {line.split()[0] for line in UPSTREAM_NAMES.read_text().splitlines() if line}
    assert set(aliases.NAMES) <= upstream, sorted(set(aliases.NAMES) - upstream)
