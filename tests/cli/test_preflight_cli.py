"""Every entry point fails within seconds, with a one-line fix, on a wrong URL or missing path."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from atroposlib.testing.fake_server import FakeOpenAIServer
from tests.fixtures.api_server import free_port

ROOT = Path(__file__).resolve().parents[2]
ENV_SCRIPT = str(ROOT / "environments" / "arithmetic_server.py")


def _run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=30,
                          env=env, cwd=cwd or ROOT)


def _closed() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_env_process_with_unreachable_inference_server(tmp_path):
    url = _closed() + "/v1"
    result = _run(ENV_SCRIPT, "process", "--openai.base_url", url, "--openai.model_name", "m",
                  "--env.tokenizer_name", str(tmp_path), cwd=tmp_path)
    assert result.returncode != 0
    assert f"inference server is not reachable at {url}" in result.stderr
    assert "Traceback" not in result.stderr


def test_env_evaluate_with_wrong_model_name_names_the_served_one(tmp_path):
    with FakeOpenAIServer() as server:
        result = _run(ENV_SCRIPT, "evaluate", "--openai.base_url", server.base_url,
                      "--openai.model_name", "no-such-model", "--env.tokenizer_name",
                      str(tmp_path), cwd=tmp_path)
    assert result.returncode != 0
    assert "'no-such-model' is not served" in result.stderr
    assert server.server.config.model_name in result.stderr


def test_env_serve_without_run_api_fails_when_not_told_to_wait(tmp_path):
    with FakeOpenAIServer() as server:
        api = _closed()
        result = _run(ENV_SCRIPT, "serve", "--wait_for_services", "false", "--env.rollout_server_url",
                      api, "--openai.base_url", server.base_url, "--openai.model_name",
                      server.server.config.model_name, "--env.tokenizer_name", str(tmp_path),
                      cwd=tmp_path)
    assert result.returncode != 0
    assert f"run-api is not reachable at {api}" in result.stderr and "`run-api`" in result.stderr


def test_env_with_missing_tokenizer_path(tmp_path):
    result = _run(ENV_SCRIPT, "process", "--openai.base_url", _closed() + "/v1",
                  "--env.tokenizer_name", "./no-such-model", cwd=tmp_path)
    assert result.returncode != 0
    assert "tokenizer path does not exist: ./no-such-model" in result.stderr
    assert "Repo id" not in result.stderr


def test_grpo_checks_api_and_model_before_loading(tmp_path):
    api = _closed()
    result = _run("-m", "example_trainer.grpo", "--model", str(tmp_path / "nope"),
                  "--api-url", api, "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "--model: model path does not exist" in result.stderr
    assert f"run-api is not reachable at {api}" in result.stderr
    assert "training" not in result.stdout  # the model was never loaded


def test_grpo_start_up_errors_are_one_line_with_the_fix_not_a_traceback(tmp_path):
    cases = [
        (["--lr", "abc"], {}, "--lr: Input should be a valid number"),
        (["--weight-sync", "lora"], {}, "weight_sync=lora needs a LoRA run; set --lora-r"),
        (["--rollout-engine", "hf", "--vllm-url", "http://127.0.0.1:9/v1"], {},
         "rollout_engine=hf samples from the trainer's own weights"),
        (["--rollout-engine", "vlm"], {}, "--rollout-engine: Input should be 'vllm' or 'hf'"),
        (["--resume", str(tmp_path / "nope")], {}, f"--resume {tmp_path / 'nope'}: no such directory"),
        (["--fsdp", "on"], {}, "--fsdp on needs the variables torchrun sets"),
        (["--batch-size", "7", "--micro-batch-size", "2"],
         {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
         "set --batch-size to a multiple of 4"),
    ]
    for argv, extra_env, expected in cases:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **extra_env}
        result = subprocess.run([sys.executable, "-m", "example_trainer.grpo", *argv],
                                capture_output=True, text=True, timeout=30, env=env, cwd=ROOT)
        assert result.returncode == 2, (argv, result.stderr)
        assert expected in result.stderr, (argv, result.stderr)
        assert "Traceback" not in result.stderr and "pydantic" not in result.stderr, (argv, result.stderr)
        assert result.stderr.startswith("atropos-grpo: "), (argv, result.stderr)


def test_launch_reports_every_wrong_key_with_its_path_before_starting(tmp_path):
    config = tmp_path / "launch.yaml"
    config.write_text(
        "trainer:\n  lr_rate: 1.0e-5\n"
        f"envs:\n  - name: arith\n    script: {ENV_SCRIPT}\n    args: {{env.group_sizee: 8}}\n"
        f"run_dir: {tmp_path / 'run'}\n")
    result = _run("-m", "atroposlib.cli.launch", str(config))
    assert result.returncode == 2
    assert "trainer.lr_rate: unknown key; did you mean trainer.lr?" in result.stderr
    assert "envs.arith.args.env.group_sizee: unknown flag; did you mean " \
           "envs.arith.args.env.group_size" in result.stderr
    assert not (tmp_path / "run").exists()  # nothing was started


def test_launch_missing_model_path(tmp_path):
    config = tmp_path / "launch.yaml"
    config.write_text(f"trainer:\n  model: ./no-such-model\n"
                      f"envs:\n  - name: arith\n    script: {ENV_SCRIPT}\n")
    result = _run("-m", "atroposlib.cli.launch", str(config), cwd=tmp_path)
    assert result.returncode == 2
    assert "trainer.model: model path does not exist: ./no-such-model" in result.stderr


def test_run_api_on_a_busy_port_says_so_before_any_banner():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        result = _run("-m", "atroposlib.cli.run_api", "--port", str(port))
    assert result.returncode == 2
    assert f"port {port} on 127.0.0.1 is in use" in result.stderr
    assert f"--port {port + 1}" in result.stderr
    assert "run-api on" not in result.stderr + result.stdout


def test_sft_gen_with_missing_tokenizer(tmp_path):
    result = _run("-m", "atroposlib.cli.sft", str(tmp_path / "out.jsonl"), "--tokenizer",
                  "./no-such-tokenizer", "--api-url", _closed(), cwd=tmp_path)
    assert result.returncode == 1
    assert "tokenizer path does not exist: ./no-such-tokenizer" in result.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_env_serve_by_default_says_what_it_waits_for_and_keeps_running(tmp_path):
    api = _closed()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, ENV_SCRIPT, "serve", "--env.rollout_server_url", api,
         "--openai.base_url", _closed() + "/v1", "--env.tokenizer_name", str(tmp_path)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=tmp_path)
    try:
        seen = []
        for line in proc.stderr:  # the preflight lines come before the serve loop's
            seen.append(line)
            if "waiting for inference server" in line:
                break
        text = "".join(seen)
        assert f"waiting for run-api at {api} (start it with `run-api`)" in text
        assert proc.poll() is None  # told to wait (serve's default): not an error
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_sft_and_dpo_gen_with_unreachable_run_api_name_the_fix(tmp_path):
    api = _closed()
    for module in ("atroposlib.cli.sft", "atroposlib.cli.dpo"):
        result = _run("-m", module, str(tmp_path / "out.jsonl"), "--api-url", api, cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        assert (f"run-api is not reachable at {api} (connection refused): start it with `run-api` "
                "or pass its URL with --api-url") in result.stderr
        assert not (tmp_path / "out.jsonl").exists()


def test_view_run_checks_port_api_and_tokenizer_before_starting_gradio(tmp_path):
    api = _closed()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        result = _run("-m", "atroposlib.cli.view_run", "--api-url", api, "--port", str(port),
                      "--tokenizer", "./no-such-tokenizer", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert lines == [
        "view-run: error: --tokenizer: tokenizer path does not exist: ./no-such-tokenizer; run "
        "atropos-bundled-model (prints the bundled model's directory) or pass a hub id with "
        "network access",
        f"view-run: error: port {port} on 127.0.0.1 is in use (Address already in use): "
        f"another view-run? stop it or pass --port {port + 1}",
        f"view-run: error: run-api is not reachable at {api} (connection refused): start it "
        "with `run-api` or pass its URL with --api-url",
    ]
