"""One flags module: every command's flags take both spellings, and ``config`` prints settings.

Real parsers of real commands (run-api, atropos-grpo, atropos-inference-node, the proxy, an env
script), no mocks; the env and the trainer's ``config`` subcommands run as subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from atroposlib.utils.flags import ArgumentParser, parse_settings, settings_parser

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=120)


def test_a_flag_is_taken_in_either_spelling_unless_the_parser_declares_both():
    parser = ArgumentParser(prog="tool")
    parser.add_argument("--max-sessions", type=int)
    parser.add_argument("--env.group_size")
    parser.add_argument("--a-b", action="store_true")
    parser.add_argument("--a_b", action="store_const", const="under")
    args = parser.parse_args(["--max_sessions", "3", "--env.group-size=8", "--a_b"])
    assert (args.max_sessions, getattr(args, "env.group_size"), args.a_b) == (3, "8", "under")
    assert parser.parse_args(["--a-b"]).a_b is True  # declared twice: each spelling its own flag
    rest = parser.parse_known_args(["--max-sessions", "1", "--", "--env.group-size"])[1]
    assert rest == ["--", "--env.group-size"]  # after --: left as given


def test_prefixes_of_a_flag_stay_typos_in_either_spelling(capsys):
    parser = ArgumentParser(prog="tool")
    parser.add_argument("--max-sessions", type=int)
    with pytest.raises(SystemExit):
        parser.parse_args(["--max_session", "3"])
    assert "unknown flag --max_session; did you mean --max-sessions?" in capsys.readouterr().err


def test_run_api_node_proxy_and_trainer_take_both_spellings():
    from atroposlib.cli import inference_node, run_api
    from atroposlib.proxy import run_proxy
    from example_trainer import grpo

    api = run_api.parse_settings(["--max_queued_groups", "5", "--max-body-bytes", "9",
                                  "--no-gzip_batch", "--allowed_hosts", "a,b"])
    assert (api.max_queued_groups, api.max_body_bytes, api.gzip_batch, api.allowed_hosts) == (
        5, 9, False, ["a", "b"])
    node = parse_settings(inference_node.build_parser(), ["--max_model_len", "64", "--serve-base"])
    assert (node.max_model_len, node.serve_base) == (64, True)
    proxy = parse_settings(run_proxy.build_parser(), ["--max_sessions", "3", "--session-ttl", "2"])
    assert (proxy.max_sessions, proxy.session_ttl) == (3, 2.0)
    trainer = parse_settings(grpo.build_parser(), ["--model", "m", "--batch_size", "8",
                                                   "--micro-batch-size", "4", "--no_tensorboard"])
    assert (trainer.batch_size, trainer.micro_batch_size, trainer.tensorboard) == (8, 4, False)


def test_a_plain_model_reads_flags_only(monkeypatch):
    from atroposlib.api.settings import ApiSettings

    monkeypatch.setenv("port", "1234")  # what a BaseSettings without a prefix would read
    parser = settings_parser(ApiSettings, prog="run-api")
    assert parse_settings(parser, []).port == ApiSettings().port


def test_a_bad_value_names_the_flag(capsys):
    from atroposlib.cli import run_api

    with pytest.raises(SystemExit) as exc:
        run_api.parse_settings(["--port", "x"])
    assert exc.value.code == 2
    assert "--port: Input should be a valid integer" in capsys.readouterr().err


def test_env_config_json_prints_what_serve_would_run_with():
    done = _run("environments/arithmetic_server.py", "config", "--json", "--env.group-size", "4",
                "--openai.api_key", "s3cret", "--openai.base-url", "http://127.0.0.1:1/v1")
    assert done.returncode == 0, done.stderr
    settings = json.loads(done.stdout)
    assert settings["mode"] == "serve" and settings["env"]["group_size"] == 4
    assert settings["env"]["wandb_name"] == "arithmetic"  # serve's own default
    assert settings["openai"][0]["base_url"] == "http://127.0.0.1:1/v1"
    assert settings["openai"][0]["api_key"] == "***" and "s3cret" not in done.stdout
    assert settings["wait_for_services"] is True


def test_env_config_prints_yaml_for_another_mode():
    done = _run("environments/arithmetic_server.py", "config", "--mode", "process",
                "--env.group_size", "4")
    assert done.returncode == 0, done.stderr
    settings = yaml.safe_load(done.stdout)
    assert settings["mode"] == "process" and settings["env"]["include_messages"] is True


def test_env_config_refuses_a_typo_with_the_closest_flag():
    done = _run("environments/arithmetic_server.py", "config", "--json", "--env.group_sise", "4")
    assert done.returncode == 2 and done.stdout == ""
    assert "unknown flag --env.group_sise; did you mean --env.group_size?" in done.stderr


def test_trainer_config_json_prints_the_resolved_settings():
    done = _run("-m", "example_trainer.grpo", "config", "--json", "--model", "m",
                "--batch_size", "8", "--micro-batch-size", "2", "--api-key", "s3cret")
    assert done.returncode == 0, done.stderr
    settings = json.loads(done.stdout)
    assert (settings["batch_size"], settings["micro_batch_size"], settings["model"]) == (8, 2, "m")
    assert settings["api_key"] == "***" and "s3cret" not in done.stdout
    bad = _run("-m", "example_trainer.grpo", "config", "--lr", "abc")
    assert bad.returncode == 2 and "--lr: Input should be a valid number" in bad.stderr


def test_launcher_reads_the_group_size_through_the_env_config_subcommand():
    from atroposlib.launch.config import EnvSection, env_arg_check

    script = str(REPO / "environments/arithmetic_server.py")
    check = env_arg_check(EnvSection(name="a", script=script, args={"env.group-size": 4}))
    assert (check.problems, check.group_size) == ([], 4)
    check = env_arg_check(EnvSection(name="a", script=script, args={"env.group_size": "x"}))
    assert check.group_size is None
    assert check.problems[0].startswith("envs.a.args: --env.group_size: Input should be a valid integer")


def test_nested_sections_nest_and_dotted_field_names_stay_one_key():
    """``--env.item_filter.floor`` comes back nested; a field named with dots (a verifiers knob,
    ``taskset.data_file``) stays one key, so the two cannot be confused."""
    from pydantic import BaseModel, ConfigDict, Field, create_model

    from atroposlib.utils.flags import collect_overrides

    class Section(BaseModel):
        floor: float = 0.05

    model = create_model("Knobs", __config__=ConfigDict(extra="allow"),
                         item_filter=(Section, Field(default_factory=Section)),
                         **{"taskset.data_file": (str, "a.jsonl")})
    parser = settings_parser(model, "env")
    namespace = parser.parse_args(["--env.item_filter.floor", "0.2", "--env.taskset.data_file", "b.jsonl"])
    assert collect_overrides(namespace, ["env"]) == {
        "env": {"item_filter": {"floor": "0.2"}, "taskset.data_file": "b.jsonl"}}
