"""Trainers by name (``atroposlib.trainers``): lookup, its errors, and atropos-launch running a third-party one."""

from __future__ import annotations

import sys
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import ClassVar

import pytest
import yaml
from pydantic import BaseModel

from atroposlib.cli.launch import Launcher, load_config, main, trainer_command
from atroposlib.errors import ConfigError
from atroposlib.launch.trainers import (
    ENTRY_POINT_GROUP,
    UnknownTrainerError,
    load_trainer,
    select_trainer,
)

REPO = Path(__file__).resolve().parents[2]
ENV_SCRIPT = str(REPO / "environments/arithmetic_server.py")


class GoodSettings(BaseModel):
    """A trainer's settings model as the entry point must name it."""

    run_module: ClassVar[str] = "my_pkg.train"
    steps: int = 1


class NoRunModule(BaseModel):
    """Settings without the module to run."""

    steps: int = 1


def _ep(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)


def test_select_picks_the_name_and_the_first_registration_wins():
    first, second = _ep("grpo", "a.config:A"), _ep("grpo", "b.config:B")
    assert select_trainer("grpo", [first, _ep("ppo", "c:C"), second]) is first


def test_unknown_name_lists_installed_trainers_and_the_fix_on_one_line():
    with pytest.raises(UnknownTrainerError) as info:
        select_trainer("gpro", [_ep("ppo", "c:C"), _ep("grpo", "a:A")])
    message = str(info.value)
    assert "\n" not in message
    assert "unknown trainer 'gpro'; installed trainers: grpo, ppo" in message
    assert ENTRY_POINT_GROUP in message and "pip install -e ." in message


def test_nothing_registered_says_so_and_how_to_register():
    with pytest.raises(UnknownTrainerError, match="no trainers are installed.*pip install -e ."):
        select_trainer("grpo", [])


def test_load_returns_the_model_and_its_run_module():
    trainer = load_trainer("mine", [_ep("mine", f"{__name__}:GoodSettings")])
    assert trainer.config_model is GoodSettings and trainer.run_module == "my_pkg.train"


@pytest.mark.parametrize(("target", "match"), [
    (f"{__name__}:NoRunModule", "has no run_module; add `run_module: ClassVar"),
    (f"{__name__}:_ep", "not a pydantic model"),
    ("no_such_pkg_xyz.config:Settings", "failed to import: ModuleNotFoundError.*pip install -e ."),
])
def test_bad_registration_is_a_config_error_naming_the_target(target, match):
    with pytest.raises(ConfigError, match=match):
        load_trainer("mine", [_ep("mine", target)])


def test_pyproject_registers_grpo_whose_run_module_is_no_setting():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    target = declared[ENTRY_POINT_GROUP]["grpo"]
    trainer = load_trainer("grpo", [_ep("grpo", target)])
    assert trainer.run_module == "example_trainer.grpo"
    assert "run_module" not in trainer.config_model.model_fields


def test_installed_metadata_resolves_grpo():
    """Fails until the checkout is (re)installed: ``pip install -e .`` records the entry point."""
    assert load_trainer("grpo").run_module == "example_trainer.grpo"


def _config(tmp_path: Path, **top) -> Path:
    path = tmp_path / "launch.yaml"
    path.write_text(yaml.safe_dump({"envs": [{"name": "arith", "script": ENV_SCRIPT}], **top}))
    return path


def test_launch_with_an_unknown_trainer_name_exits_2_naming_the_installed_ones(tmp_path, capsys):
    assert main([str(_config(tmp_path, trainer_name="nope"))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown trainer 'nope'; installed trainers: " in err
    assert "grpo" in err


def test_launch_runs_a_trainer_another_package_registers(tmp_path, monkeypatch):
    """A distribution on sys.path declares ``tiny``; launch validates against it and runs its module."""
    (tmp_path / "tiny_trainer.py").write_text(
        "from typing import ClassVar\nfrom pydantic import BaseModel, ConfigDict\n\n"
        "class TinyConfig(BaseModel):\n    model_config = ConfigDict(extra='forbid')\n"
        "    run_module: ClassVar[str] = 'tiny_trainer'\n"
        "    api_url: str\n    run_dir: str\n    steps: int = 1\n")
    info = tmp_path / "tiny_trainer-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-trainer\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ntiny = tiny_trainer:TinyConfig\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tiny_trainer", raising=False)

    with pytest.raises(ConfigError, match="trainer.stepz: unknown key; did you mean trainer.steps"):
        load_config(_config(tmp_path, trainer_name="tiny", trainer={"stepz": 2}))
    config = load_config(_config(tmp_path, trainer_name="tiny", trainer={"steps": 2},
                                 run_dir=str(tmp_path / "run")))
    module = Launcher(config).trainer_module
    assert module == "tiny_trainer"
    assert trainer_command(module, 1) == [sys.executable, "-m", "tiny_trainer"]


def test_trainer_name_must_be_a_string(tmp_path):
    with pytest.raises(ConfigError, match="trainer_name"):
        load_config(_config(tmp_path, trainer_name=3))

