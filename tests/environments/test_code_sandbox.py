"""The code-execution env and its sandbox: it refuses to run model code unconfined, a sandbox that
cannot start is an error of the env (never a score of -1), and every group names its backend."""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest

from atroposlib.env_runtime.step import Skip, run_item
from atroposlib.utils import sandbox, sandbox_backends
from atroposlib.utils.sandbox import SandboxLimits, SandboxStartError, resolve_backend
from tests.environments.test_env_behaviour import make_env

GOOD = "```python\ndef add(a, b):\n    return a + b\n```"


def _process(tok_dir, out, *flags):
    """Run the env's real CLI in ``process`` mode (in this process); return its exit code."""
    from atroposlib.env_runtime.command_line import run_cli
    from atroposlib.environments.code_execution_env import CodeExecutionEnv

    try:
        run_cli(CodeExecutionEnv, ["process", "--testing", f"--env.tokenizer_name={tok_dir}",
                                   "--env.dataset_name=builtin", "--env.group_size=2",
                                   "--env.total_steps=1", "--env.wall_seconds=5",
                                   f"--env.data_path_to_save_groups={out}", *flags])
    except SystemExit as exc:
        return exc.code
    return 0


def _groups(out):
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def test_env_refuses_to_start_without_an_isolating_backend(tok_dir, tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # neither bwrap nor unshare
    sandbox_backends.clear_probes()
    try:
        code = _process(tok_dir, tmp_path / "out.jsonl")
    finally:
        sandbox_backends.clear_probes()
    err = capsys.readouterr().err
    assert code == 2, err
    assert "error: no isolating sandbox backend works on this host" in err
    assert "apt-get install bubblewrap" in err and "--env.sandbox none" in err
    assert _groups(tmp_path / "out.jsonl") == []  # not one program ran


def test_default_backend_is_recorded_in_every_group_and_the_log(tok_dir, tmp_path, caplog):
    out = tmp_path / "out.jsonl"
    with caplog.at_level(logging.INFO, logger="atroposlib.environments.code_execution_env"):
        assert _process(tok_dir, out) == 0
    backend = resolve_backend(None)
    groups = _groups(out)
    assert len(groups) == 1
    assert groups[0]["group_overrides"]["sandbox_backend"] == backend
    assert f"code sandbox: backend {backend} (isolation: netns" in caplog.text


def test_explicit_none_is_an_opt_in_that_warns_once(tok_dir, tmp_path, monkeypatch, capsys, caplog):
    """``--env.sandbox none`` runs (one warning), or, where the run's unprivileged uid cannot read
    this interpreter (a root host with Python under /root), stops with the cause: never a
    group of -1 scores."""
    monkeypatch.setattr(sandbox, "_warned_none", False)
    out = tmp_path / "out.jsonl"
    with caplog.at_level(logging.WARNING, logger="atroposlib.utils.sandbox"):
        code = _process(tok_dir, out, "--env.sandbox=none")
    err = capsys.readouterr().err
    warnings = [r for r in caplog.records if "unconfined" in r.getMessage()]
    assert len(warnings) == 1
    closed = sandbox_backends.closed_to_others(
        sandbox_backends.interpreter_dirs(sys.executable), parents=True)
    if os.geteuid() == 0 and closed is not None:
        assert code == 2, err
        assert "could not start the program" in err and closed in err
        assert "No module named" in err
        assert _groups(out) == []
    else:
        assert code == 0, err
        assert [g["group_overrides"]["sandbox_backend"] for g in _groups(out)] == ["none"]


async def test_a_sandbox_that_cannot_start_stops_the_env_at_setup(tok_dir):
    # 1 ms: no interpreter starts that fast, so no program ever runs; main scored each reply -1
    with pytest.raises(SandboxStartError, match="did not reach the program within wall_seconds"):
        await make_env("code_execution", tok_dir, lambda r: GOOD, dataset_name="builtin",
                       wall_seconds=0.001)


async def test_a_run_that_cannot_start_drops_the_group_instead_of_scoring_it(tok_dir):
    env, _ = await make_env("code_execution", tok_dir, lambda r: GOOD, dataset_name="builtin",
                            group_size=2)
    item = await env.get_next_item()
    group, _ = await env.collect_trajectories(item)
    assert group["group_overrides"]["sandbox_backend"] == env.sandbox_backend
    assert {d["sandbox_backend"] for d in env.train_details} == {env.sandbox_backend}
    env.limits = SandboxLimits(wall_seconds=0.001)  # the sandbox breaks after setup
    with pytest.raises(SandboxStartError):
        await env.collect_trajectories(item)
    outcome = await run_item(env, item)
    assert outcome.reason is Skip.ERROR and outcome.groups == []
    assert isinstance(outcome.error, SandboxStartError)
    assert env.stats["groups_dropped_error"] == 1
