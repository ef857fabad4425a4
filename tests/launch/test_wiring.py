"""What atropos-launch tells each part: the evaluation command and the envs' serve flags."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from atroposlib.launch.config import load_config
from atroposlib.launch.wiring import env_serve_flags, eval_command

REPO = Path(__file__).resolve().parents[2]
ENV_SCRIPT = str(REPO / "environments/arithmetic_server.py")


def _config(tmp_path: Path, **extra):
    path = tmp_path / "launch.yaml"
    path.write_text(yaml.safe_dump({
        "trainer": {"model": "/models/policy", "served_model_name": "policy"},
        "envs": [{"name": "a", "script": ENV_SCRIPT, "server_type": "vllm",
                  "args": {"env.group_size": 4, "env.rollout_server_url": "http://elsewhere"}}],
        "eval_env": "a", "eval_args": {"env.eval_limit": 8}, **extra}))
    return load_config(path)


def test_the_eval_command_reaches_the_served_policy_and_leaves_the_launchers_flags_out(tmp_path):
    config = _config(tmp_path)
    command, files = eval_command(config, config.envs[0], config.trainer_settings, "/py", "/run", [])
    argv = shlex.split(command)
    assert argv[:3] == ["/py", ENV_SCRIPT, "evaluate"] and files == {}
    assert "--env.rollout_server_url" not in argv  # the launcher's own flag, not the env's value
    for flag, value in [("--env.group_size", "4"), ("--env.eval_limit", "8"),
                        ("--env.tokenizer_name", "/models/policy"), ("--openai.base_url", "{base_url}"),
                        ("--env.data_dir_to_save_evals", "{out_dir}")]:
        assert argv[argv.index(flag) + 1] == value


def test_with_inference_nodes_the_eval_and_the_envs_read_the_nodes_from_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("ATROPOS_API_KEY", "k3y")
    config = _config(tmp_path)
    nodes = ["http://n:1/v1", "http://n:2/v1"]
    command, files = eval_command(config, config.envs[0], config.trainer_settings, "/py", "/run", nodes)
    assert "--config /run/eval-servers.yaml" in command and "{base_url}" not in command
    listed = yaml.safe_load(files["eval-servers.yaml"])["openai"]
    assert [(s["base_url"], s["model_name"], s["api_key"]) for s in listed] == [
        ("http://n:1/v1", "policy", "k3y"), ("http://n:2/v1", "policy", "k3y")]
    flags, env_files = env_serve_flags(config, config.envs[0], "http://api:8000", "unused", nodes, "/node")
    assert flags[flags.index("--config") + 1] == "/node/a-servers.yaml" and "--openai.base_url" not in flags
    assert flags[flags.index("--env.rollout_server_url") + 1] == "http://api:8000"
    assert yaml.safe_load(env_files["a-servers.yaml"]) == yaml.safe_load(files["eval-servers.yaml"])


def test_an_env_reaching_one_server_gets_it_as_flags(tmp_path):
    config = _config(tmp_path)
    flags, files = env_serve_flags(config, config.envs[0], "http://api:8000", "http://h:9/v1", [], "/node")
    assert files is None
    assert flags[flags.index("--openai.base_url") + 1] == "http://h:9/v1"
    assert flags[flags.index("--openai.model_name") + 1] == "policy"
    assert flags[flags.index("--env.tokenizer_name") + 1] == "/models/policy"
