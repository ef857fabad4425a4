"""The env CLI: layering (config_init < YAML < flags), flag grammar, errors, help, and modes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.api.models import ScoredData
from atroposlib.env_runtime.command_line import build_env, parse_args
from atroposlib.inference.clients.config import APIServerConfig
from tests.fixtures.sample_envs import ChatLengthEnv

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "tests.fixtures.sample_envs", "ChatLengthEnv", *args],
                          cwd=cwd or REPO, env=env, capture_output=True, text=True, timeout=120)


def test_defaults_keep_the_single_server_config_as_given():
    mode, env, servers, manager = parse_args(ChatLengthEnv, ["serve"])
    assert mode == "serve"
    assert env.group_size == 4 and env.wandb_name == "chat_length"  # serve defaults the name
    assert isinstance(servers, list) and len(servers) == 1
    assert servers[0].base_url == "http://127.0.0.1:9/v1" and servers[0].api_key == "x"
    assert manager.slurm is False and manager.testing is False


def test_layering_yaml_over_config_init_and_flags_over_yaml(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "env:\n  group_size: 6\n  max_token_length: 300\n"
        "openai:\n  model_name: yaml-model\n  base_url: http://127.0.0.1:7/v1\n  weight: 2\n"
        "slurm: false\ntesting: true\n"
    )
    _, env, servers, manager = parse_args(ChatLengthEnv, [
        "process", "--config", str(cfg), "--env.group_size", "8", "--openai.model_name", "cli-model",
        "--env.max_num_workers=-1", "--env.total_steps", "-1", "--env.use_wandb",
        "--env.wandb_name", "None", "--slurm", "false",
    ])
    assert env.group_size == 8  # flag > YAML
    assert env.max_token_length == 300  # YAML > config_init
    assert env.max_num_workers == -1 and env.total_steps == -1  # negative numbers both ways
    assert env.use_wandb is True and env.wandb_name is None
    assert servers == [APIServerConfig(model_name="cli-model", base_url="http://127.0.0.1:7/v1",
                                       api_key="x")]
    assert manager.testing is True and manager.slurm is False


def test_proxy_url_and_max_n_completions_reach_the_envs_server_manager(tmp_path, monkeypatch):
    monkeypatch.delenv("ATROPOS_PROXY_URL", raising=False)
    _, env = build_env(ChatLengthEnv, ["process", "--proxy_url", "http://127.0.0.1:9100",
                                       "--max_n_completions", "3"])
    assert env.server.proxy_url == "http://127.0.0.1:9100" and env.server.max_n_completions == 3
    cfg = tmp_path / "c.yaml"
    cfg.write_text("proxy_url: http://127.0.0.1:9200\n")
    _, env = build_env(ChatLengthEnv, ["serve", "--config", str(cfg)])
    assert env.server.proxy_url == "http://127.0.0.1:9200"
    _, env = build_env(ChatLengthEnv, ["serve"])
    assert env.server.proxy_url is None


def test_process_mode_defaults():
    _, env, _, _ = parse_args(ChatLengthEnv, ["process"])
    assert env.include_messages is True
    assert env.ensure_scores_are_not_same is False
    assert env.use_wandb is False
    assert env.data_path_to_save_groups == "data/chat_length.jsonl"


def test_several_yaml_servers_refuse_openai_flags(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("openai:\n  - {base_url: 'http://a/v1'}\n  - {base_url: 'http://b/v1'}\n")
    _, _, servers, _ = parse_args(ChatLengthEnv, ["serve", "--config", str(cfg)])
    assert [s.base_url for s in servers] == ["http://a/v1", "http://b/v1"]
    with pytest.raises(SystemExit) as exc:
        parse_args(ChatLengthEnv, ["serve", "--config", str(cfg), "--openai.model_name", "m"])
    assert exc.value.code == 2
    assert "--openai.model_name cannot be combined with several" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--env.group_sise", "8"], "unknown flag --env.group_sise; did you mean --env.group_size?"),
    (["serve", "--env.group_size", "many"], "--env.group_size: Input should be a valid integer"),
    (["serve", "--openai.server_type", "tgi"], "--openai.server_type"),
    (["serve", "--bogus"], "unknown flag --bogus"),
])
def test_bad_flags_exit_2_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(ChatLengthEnv, argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_yaml_is_explained(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("env:\n  group_size: 4\nopenapi:\n  model_name: x\n")
    with pytest.raises(SystemExit):
        parse_args(ChatLengthEnv, ["serve", "--config", str(cfg)])
    assert "unknown top-level key(s) ['openapi']" in capsys.readouterr().err
    cfg.write_text("env:\n  group_sizes: 4\n")
    with pytest.raises(SystemExit):
        parse_args(ChatLengthEnv, ["serve", "--config", str(cfg)])
    err = capsys.readouterr().err
    assert "--env.group_sizes: unknown field; did you mean --env.group_size?" in err


class ExtraFieldsEnv(ChatLengthEnv):
    """An env whose config_init passes a field BaseEnvConfig does not declare (upstream idiom)."""

    @classmethod
    def config_init(cls):
        env_config, servers = super().config_init()
        return env_config.model_copy(update={"score_buffer_size": 5}), servers


def test_code_set_extra_fields_survive_the_cli_and_yaml_may_override_them(tmp_path, recwarn):
    _, env, _, _ = parse_args(ExtraFieldsEnv, ["serve"])
    assert env.score_buffer_size == 5
    cfg = tmp_path / "c.yaml"
    cfg.write_text("env:\n  score_buffer_size: 9\n")
    _, env, _, _ = parse_args(ExtraFieldsEnv, ["serve", "--config", str(cfg)])
    assert env.score_buffer_size == 9
    cfg.write_text("env:\n  score_bufer_size: 9\n")  # a typo is still an error
    with pytest.raises(SystemExit):
        parse_args(ExtraFieldsEnv, ["serve", "--config", str(cfg)])


class CountedEnv(ChatLengthEnv):
    """Counts config_init calls; has an extra server namespace (a second YAML section)."""

    server_namespaces = {"teacher": "teacher_server_configs"}
    inits = 0

    def __init__(self, config, server_configs, teacher_server_configs=None, **kwargs):
        super().__init__(config, server_configs, **kwargs)
        self.teacher_configs = teacher_server_configs

    @classmethod
    def config_init(cls):
        cls.inits += 1
        return super().config_init()


def test_run_cli_parses_the_command_line_once(tmp_path, monkeypatch):
    """config_init runs once, the YAML file is read once, argv is parsed once (it was 3, 2, 2)."""
    from atroposlib.env_runtime import command_line as commands

    calls = {"yaml": 0, "parse": 0, "ran": None}
    real_load, real_parse = commands.load_yaml, commands.ArgumentParser.parse_known_args

    def load(*args, **kwargs):
        calls["yaml"] += 1
        return real_load(*args, **kwargs)

    def parse(self, args=None, namespace=None):
        if args and args[0] == "serve":  # the whole command line (not a mode's sub-parse)
            calls["parse"] += 1
        return real_parse(self, args, namespace)

    async def run_mode(env, mode):
        calls["ran"] = (mode, env.config.group_size, env.teacher_configs[0].model_name)

    def preflight(mode, env, wait=False):
        calls["wait"] = wait

    monkeypatch.setattr(commands, "load_yaml", load)
    monkeypatch.setattr(commands.ArgumentParser, "parse_known_args", parse)
    monkeypatch.setattr(commands, "_run_mode", run_mode)
    monkeypatch.setattr(commands, "env_preflight", preflight)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("env:\n  group_size: 6\nteacher:\n  model_name: big\n")
    CountedEnv.inits = 0
    commands.run_cli(CountedEnv, ["serve", "--config", str(cfg), "--wait_for_services", "false"])
    assert calls["ran"] == ("serve", 6, "big") and calls["wait"] is False
    assert (CountedEnv.inits, calls["yaml"], calls["parse"]) == (1, 1, 1)


@pytest.mark.parametrize(("argv", "wait"), [
    (["serve"], True), (["process"], False), (["evaluate"], False),
    (["serve", "--wait_for_services", "false"], False), (["process", "--wait_for_services"], True),
    # the earlier kebab-case spellings still work
    (["serve", "--no-wait-for-services"], False), (["process", "--wait-for-services"], True),
])
def test_wait_for_services_is_a_flag_like_its_neighbours(argv, wait):
    from atroposlib.env_runtime.command_line import parse_command

    assert parse_command(ChatLengthEnv, argv).wait_for_services is wait


def test_help_lists_every_option_with_description_and_default_without_torch():
    code = (
        "import sys\n"
        "from tests.fixtures.sample_envs import ChatLengthEnv\n"
        "try:\n    ChatLengthEnv.cli(['process', '--help'])\nexcept SystemExit:\n    pass\n"
        "print('TORCH_LOADED' if 'torch' in sys.modules else 'NO_TORCH')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "250"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60).stdout
    assert out.strip().endswith("NO_TORCH")
    for flag in ("--env.group_size", "--env.data_path_to_save_groups", "--openai.base_url",
                 "--openai.server_type", "--slurm", "--testing", "--config", "--wait_for_services"):
        assert flag in out
    assert "Rollouts (responses) per group. (default: 4)" in out
    assert "(default: 'http://127.0.0.1:9/v1')" in out  # defaults come from config_init
    assert "(default: True)" in out  # include_messages in process mode
    assert "--wait-for-services" not in out  # the old spelling is accepted, not advertised


def test_process_writes_valid_jsonl_and_html(tiny_tokenizer_dir, tmp_path):
    target = tmp_path / "out" / "groups.jsonl"
    target.parent.mkdir()
    target.write_text("existing\n")  # never overwritten: the run writes groups_1.jsonl
    proc = _run("process", "--testing", "--env.tokenizer_name", str(tiny_tokenizer_dir),
                "--env.total_steps", "3", "--env.data_path_to_save_groups", str(target))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert target.read_text() == "existing\n"
    written = target.with_name("groups_1.jsonl")
    lines = written.read_text().splitlines()
    assert len(lines) == 3
    for line in lines:
        group = ScoredData.model_validate_json(line)
        assert len(group.tokens) == 4
        assert group.messages[0][0]["content"].startswith("Question number")
    page = written.with_suffix(".html").read_text()
    assert "Question number 1?" in page and "This is a fake response." in page
    assert "Group 3" in page


def test_evaluate_writes_metrics_json_and_prints_its_path(tiny_tokenizer_dir, tmp_path):
    proc = _run("evaluate", "--testing", "--env.tokenizer_name", str(tiny_tokenizer_dir),
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("metrics written to ")][-1]
    path = Path(tmp_path, line.removeprefix("metrics written to "))
    assert path.parent.parent == tmp_path / "evals" and path.parent.name.startswith("chat_length-")
    metrics = json.loads(path.read_text())
    assert metrics["results"]["all"]["eval/mean_length"] > 0
    assert metrics["results"]["atropos|chat_length|0"] == metrics["results"]["all"]
    assert metrics["config_general"]["model_name"] == "fake"


def test_config_init_subclass_fields_become_flags_even_without_env_config_cls():
    from pydantic import Field

    from atroposlib.envs.base import BaseEnvConfig

    class Extra(BaseEnvConfig):
        difficulty: int = Field(default=1, description="How hard.")

    class Forgetful(ChatLengthEnv):  # returns Extra from config_init, env_config_cls not set
        @classmethod
        def config_init(cls):
            return Extra(use_wandb=False), APIServerConfig(base_url="http://127.0.0.1:9/v1")

    _, env, _, _ = parse_args(Forgetful, ["process", "--env.difficulty", "3"])
    assert isinstance(env, Extra) and env.difficulty == 3


@pytest.mark.parametrize(("sig", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_stopping_process_keeps_what_was_written(tiny_tokenizer_dir, tmp_path, sig, code):
    import signal
    import time

    target = tmp_path / "groups.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.sample_envs", "ChatLengthEnv", "process", "--testing",
         "--env.tokenizer_name", str(tiny_tokenizer_dir), "--env.total_steps", "1000000",
         "--env.data_path_to_save_groups", str(target)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and (not target.exists() or target.stat().st_size == 0):
        time.sleep(0.2)
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err
    lines = target.read_text().splitlines()
    assert lines and all(json.loads(line)["scores"] for line in lines)
    assert "Group 1" in target.with_suffix(".html").read_text()
