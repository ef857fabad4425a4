"""The wheel ships only atroposlib and example_trainer, as Atropos 0.4's does.

A top-level ``environments`` package in our wheel shadowed the ``environments/`` folder of
Atropos's own repository (and of users' projects): ``from environments.community.x import ...``
failed with ``No module named 'environments.community'``. These tests build the real wheel and
import a user's ``environments`` package beside an installed atroposlib.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    pytest.importorskip("hatchling", reason="hatchling builds the wheel (pip's build backend)")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--no-index", "-q", "-w", str(out), str(REPO)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("atroposlib-*.whl")
    return whl


def test_wheel_has_only_atroposlib_and_example_trainer_at_top_level(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"atroposlib", "example_trainer"}
    assert "atroposlib/environments/gsm8k_server.py" in names
    assert "atroposlib/inference/vllm_logging.json" in names  # the config VLLMProcess gives vLLM
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "gsm8k = atroposlib.environments.gsm8k_server:GSM8kEnv" in text


def test_a_users_environments_package_is_not_shadowed(tmp_path):
    """Upstream's layout: environments/community/x.py imported as environments.community.x."""
    pkg = tmp_path / "environments" / "community"
    pkg.mkdir(parents=True)
    (tmp_path / "environments" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "my_env.py").write_text("from atroposlib.envs.base import BaseEnv\n\n"
                                   "class MyEnv(BaseEnv):\n    name = 'mine'\n")
    code = ("import environments.community.my_env as m, atroposlib.environments.gsm8k_server as g\n"
            "print(m.MyEnv.__mro__[1].__module__, g.GSM8kEnv.name)")
    # From the user's project directory, and with this repository's root on sys.path too, even
    # ahead of the user's (an editable install adds it): a checkout's environments/ launcher
    # folder is a namespace portion, so a regular package anywhere on the path wins.
    elsewhere = tmp_path / "cwd"  # `python -c` puts the cwd first on sys.path
    elsewhere.mkdir()
    for first in ([], [str(REPO)]):
        env_path = ":".join([*first, str(tmp_path)])
        proc = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True,
                              text=True, timeout=120, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin",
                                                           "HF_HUB_OFFLINE": "1"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split() == ["atroposlib.envs.base", "gsm8k"]


def test_checkout_launchers_run_the_packaged_envs():
    """``python environments/X.py`` (the Atropos way) runs the class from atroposlib.environments."""
    launchers = sorted((REPO / "environments").glob("*.py"))
    assert launchers and not (REPO / "environments" / "__init__.py").exists()
    for path in launchers:
        module = path.stem
        assert (REPO / "atroposlib" / "environments" / f"{module}.py").exists(), module
        assert f"from atroposlib.environments.{module} import " in path.read_text()
    proc = subprocess.run([sys.executable, "environments/arithmetic_server.py", "serve", "--help"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--env.difficulty" in proc.stdout
