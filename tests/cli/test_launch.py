"""atropos-launch: config validation, flag rendering, fail-fast and clean shutdown with real processes."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from atroposlib.cli.launch import (
    Launcher,
    describe_config,
    flags,
    load_config,
    main,
    trainer_command,
    trainer_flags,
)
from atroposlib.errors import ConfigError
from atroposlib.inference.bundled import bundled_model_dir
from atroposlib.launch.orchestration import record_failure, record_interrupt

REPO = Path(__file__).resolve().parents[2]
BUNDLED = bundled_model_dir()
# The session fixture builds the bundled model when it is missing (a fresh machine), so
# these tests run there rather than skip.
needs_model = pytest.mark.usefixtures("bundled_model_dir")


def _write(tmp_path, data) -> Path:
    path = tmp_path / "launch.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _base(tmp_path, **trainer):
    return {"trainer": trainer, "envs": [{"name": "arith", "script": str(REPO / "environments/arithmetic_server.py")}]}


def test_quickstart_config_is_valid():
    config = load_config(REPO / "configs/quickstart-cpu.yaml")
    assert config.eval_env == "arithmetic"
    assert Path(config.envs[0].script).is_file()
    assert config.trainer["weight_sync"] == "auto"


def test_the_full_fine_tuning_quickstart_differs_only_in_lora_and_its_learning_rate():
    lora = load_config(REPO / "configs/quickstart-cpu.yaml")
    full = load_config(REPO / "configs/quickstart-cpu-full.yaml")
    assert lora.trainer["lora_r"] > 0 and "lora_r" not in full.trainer
    different = {k for k in lora.trainer.keys() | full.trainer.keys() if lora.trainer.get(k) != full.trainer.get(k)}
    assert different == {"lora_r", "lora_alpha", "lr"}
    assert [e.model_dump() for e in lora.envs] == [e.model_dump() for e in full.envs]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"trainer": {}}, "envs"),
        ({"trainer": {"lrr": 1}, "envs": [{"name": "a", "script": "environments/arithmetic_server.py"}]}, "trainer.lrr|lrr"),
        ({"trainer": {"lr": -1}, "envs": [{"name": "a", "script": "environments/arithmetic_server.py"}]}, "lr"),
        ({"trainer": {"api_url": "http://x"}, "envs": [{"name": "a", "script": "environments/arithmetic_server.py"}]}, "set by atropos-launch"),
        ({"envs": [{"name": "a", "script": "environments/arithmetic_server.py"}] * 2}, "unique"),
        ({"envs": [{"name": "a", "script": "environments/arithmetic_server.py"}], "eval_env": "b"}, "eval_env"),
        ({"envs": [{"name": "a", "script": "nope/missing.py"}]}, "not found"),
        ({"envs": [{"name": "a", "script": "environments/arithmetic_server.py", "bogus": 1}]}, "bogus"),
        ({"trainer": {"nproc_per_node": 0}, "envs": [{"name": "a", "script": "environments/arithmetic_server.py"}]}, "nproc_per_node must be"),
        ({"trainer": {"batch_size": 12, "micro_batch_size": 4},
          "envs": [{"name": "a", "script": "environments/arithmetic_server.py", "args": {"env.group_size": 8}}]},
         "batch_size 12 is not a multiple of group_size 8.*e.g. 8 or 16"),
    ],
)
def test_bad_configs_raise_config_error_naming_the_problem(tmp_path, data, match):
    with pytest.raises(ConfigError, match=match):
        load_config(_write(tmp_path, data))


@pytest.mark.parametrize("args", [
    {},  # group_size left to the env: its config_init default (8) is what it will run with
    {"env.group_size": "8"},  # a quoted value: the env parses it as 8
])
def test_batch_size_is_checked_against_the_group_size_the_env_will_run_with(tmp_path, args):
    data = {"trainer": {"batch_size": 12, "micro_batch_size": 4},
            "envs": [{"name": "a", "script": str(REPO / "environments/arithmetic_server.py"), "args": args}]}
    with pytest.raises(ConfigError, match="batch_size 12 is not a multiple of group_size 8"):
        load_config(_write(tmp_path, data))


def test_missing_file_and_cli_exit_code(tmp_path, capsys):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("trainer: [unclosed")
    assert main([str(tmp_path / "bad.yaml")]) == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_flag_rendering():
    assert flags({"env.group_size": 8, "slurm": True, "env.use_wandb": False, "x": None}) == [
        "--env.group_size", "8", "--slurm", "--env.use_wandb", "false"]
    assert trainer_flags({"training_steps": 3, "use_wandb": False, "gradient_checkpointing": True,
                          "vllm_extra_args": ["--a", "b"], "run_dir": None}) == [
        "--training-steps", "3", "--no-use-wandb", "--gradient-checkpointing",
        "--vllm-extra-args", '["--a", "b"]']


def test_nproc_per_node_runs_the_trainer_under_torchrun(tmp_path):
    config = load_config(_write(tmp_path, _base(tmp_path, nproc_per_node=4, batch_size=16, micro_batch_size=2)))
    assert config.trainer["nproc_per_node"] == 4
    config.run_dir = str(tmp_path / "run")
    module = Launcher(config).trainer_module
    assert module == "example_trainer.grpo"
    assert trainer_command(module, 4) == [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                          "--nproc-per-node", "4", "-m", "example_trainer.grpo"]
    assert trainer_command(module, 1) == [sys.executable, "-m", "example_trainer.grpo"]


def _descendants_alive(pids):
    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _one_env_run(tmp_path, name: str, source: str, **settings) -> Path:
    """Write the env script ``source`` and a launch config of it with a trainer but no vLLM.

    The run goes to ``tmp_path/run`` unless ``settings`` has ``run_dir`` (None: the default).
    """
    script = tmp_path / f"{name}_env.py"
    script.write_text(source)
    settings = {"run_dir": str(tmp_path / "run"), **settings}
    if settings["run_dir"] is None:
        del settings["run_dir"]
    return _write(tmp_path, {**settings,
                             "trainer": {"vllm_url": "http://127.0.0.1:9/v1", "weight_sync": "none",
                                         "training_steps": 2, "batch_size": 4, "micro_batch_size": 4},
                             "envs": [{"name": name, "script": str(script)}]})


@contextlib.contextmanager
def _launched_idle_run(tmp_path, stop_timeout: float = 10):
    """Run ``atropos-launch`` with one idle env; yield the process once the env is up.

    The launcher's process group is killed afterwards if it still runs.
    """
    config = _one_env_run(tmp_path, "idle", "import time\nprint('idle env up', flush=True)\n"
                          "while True:\n    time.sleep(1)\n", stop_timeout=stop_timeout)
    proc = subprocess.Popen([sys.executable, "-m", "atroposlib.cli.launch", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    lines = []
    try:
        deadline = time.monotonic() + 180
        for line in proc.stdout:
            lines.append(line)
            if "idle env up" in line or time.monotonic() > deadline:
                break
        assert any("idle env up" in line for line in lines), "".join(lines)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@needs_model
def test_env_that_dies_fails_fast_with_its_log_and_stops_everything(tmp_path, capsys):
    config = _one_env_run(tmp_path, "crashy",
                          "import sys\nprint('env says: cannot load my dataset', flush=True)\nsys.exit(3)\n",
                          stop_timeout=120)  # time for the trainer to save and write its summary
    launcher = Launcher(load_config(config))
    begin = time.monotonic()
    code = launcher.run()
    out = capsys.readouterr().out
    assert code == 1
    assert "crashy exited early with code 3" in out and "env says: cannot load my dataset" in out
    assert time.monotonic() - begin < 180
    assert not _descendants_alive([p.proc.pid for p in launcher.parts])
    logs = tmp_path / "run" / "logs"
    assert {"api.log", "trainer.log", "crashy.log"} <= {p.name for p in logs.iterdir()}
    assert "[crashy] env says" in out
    # the trainer only saw a stop request; the summary names the part that ended the run
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stopped"] == "error" and summary["failed_part"] == "crashy"
    assert summary["error"] == "crashy exited early with code 3"
    assert summary["steps"] == 0  # the trainer's own fields are kept


@needs_model
def test_run_api_that_dies_stops_the_run_and_the_summary_names_it(tmp_path):
    with _launched_idle_run(tmp_path) as proc:
        api = next(c for c in psutil.Process(proc.pid).children()
                   if "atroposlib.cli.run_api" in c.cmdline())
        os.killpg(api.pid, signal.SIGKILL)
        rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, rest
    assert "api exited early with code -9" in rest
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stopped"] == "error" and summary["failed_part"] == "api"
    assert summary["error"] == "api exited early with code -9"


def test_record_failure_keeps_the_trainers_own_error(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"stopped": "error", "error": "ApiError: run-api unreachable", "steps": 3}))
    record_failure(path, "api", "exited early with code 1")
    assert json.loads(path.read_text()) == {
        "stopped": "error", "error": "api exited early with code 1", "failed_part": "api",
        "trainer_error": "ApiError: run-api unreachable", "steps": 3}
    # a trainer that failed by itself: its error is the better message
    path.write_text(json.dumps({"stopped": "error", "error": "TimeoutError: no batch"}))
    record_failure(path, "trainer", "exited with code 1")
    assert json.loads(path.read_text())["error"] == "TimeoutError: no batch"
    assert json.loads(path.read_text())["failed_part"] == "trainer"
    path.write_text(json.dumps({"stopped": "error", "error": "InferenceError: vLLM died", "failed_part": "vllm"}))
    record_failure(path, "trainer", "exited with code 1")
    assert json.loads(path.read_text())["failed_part"] == "vllm"
    path.write_text(json.dumps({"stopped": "error", "error": "x", "failed_part": None}))
    record_failure(path, "trainer", "exited with code 1")
    assert json.loads(path.read_text())["failed_part"] == "trainer"
    # no summary at all (the trainer never wrote one)
    record_failure(tmp_path / "none" / "summary.json", "arith", "exited early with code 2")
    assert json.loads((tmp_path / "none" / "summary.json").read_text()) == {
        "stopped": "error", "error": "arith exited early with code 2", "failed_part": "arith"}


@needs_model
def test_sigint_stops_every_part(tmp_path):
    # time for the trainer to save checkpoints/final and write its summary on a busy machine
    with _launched_idle_run(tmp_path, stop_timeout=180) as proc:
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert len(children) >= 3
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, rest
    assert "interrupted: stopping every part" in rest
    time.sleep(0.5)
    assert not _descendants_alive(children)
    # the trainer saw a SIGTERM from the launcher; the run itself was interrupted
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stopped"] == "interrupted" and summary["stop_signal"] == signal.SIGINT
    assert summary.get("trainer_stopped") == "stop_requested", (summary, rest)
    assert summary["error"] is None and summary["failed_part"] is None
    assert summary["steps"] == 0 and "wall_seconds" in summary  # the trainer's own fields are kept


def test_record_interrupt_overrides_what_the_stopped_parts_reported(tmp_path):
    path = tmp_path / "summary.json"
    # vLLM stopped (cleanly) by the launcher before the trainer noticed the stop signal
    path.write_text(json.dumps({"stopped": "error", "failed_part": "vllm", "steps": 4,
                                "error": "VLLMDiedError: vLLM died: exited with code 0"}))
    record_interrupt(path, signal.SIGINT)
    assert json.loads(path.read_text()) == {
        "stopped": "interrupted", "stop_signal": 2, "error": None, "failed_part": None, "steps": 4,
        "trainer_stopped": "error", "trainer_error": "VLLMDiedError: vLLM died: exited with code 0"}
    # interrupted before the trainer wrote a summary (e.g. while vLLM was starting)
    record_interrupt(tmp_path / "none" / "summary.json", signal.SIGTERM)
    assert json.loads((tmp_path / "none" / "summary.json").read_text()) == {
        "stopped": "interrupted", "stop_signal": 15, "error": None, "failed_part": None}


def test_a_run_dir_that_holds_a_run_is_refused_before_anything_starts(tmp_path, capsys):
    config = _one_env_run(tmp_path, "idle", "print('never started')\n")
    (tmp_path / "run" / "logs").mkdir(parents=True)
    (tmp_path / "run" / "summary.json").write_text("{}")
    assert main([str(config)]) == 2
    err = capsys.readouterr().err
    assert f"run directory {tmp_path / 'run'} holds a run already (logs, summary.json)" in err
    assert "--run-dir" in err


@needs_model
def test_two_launches_in_one_directory_at_once_get_separate_run_dirs(tmp_path):
    config = _one_env_run(tmp_path, "crashy", "import sys\nprint('env exits', flush=True)\nsys.exit(3)\n",
                          run_dir=None, stop_timeout=180)  # each trainer saves and writes its summary
    procs = [subprocess.Popen([sys.executable, "-m", "atroposlib.cli.launch", str(config)], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for _ in range(2)]
    try:
        outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert [proc.returncode for proc in procs] == [1, 1], outputs
    run_dirs = sorted((tmp_path / "runs").iterdir())
    assert len(run_dirs) == 2
    # each says at start which config it resolved and where it writes
    printed = sorted(line.split("; run directory ")[1].strip() for out in outputs for line in out.splitlines()
                     if line.startswith(f"[launch] config {config}; run directory "))
    assert printed == [str(d.relative_to(tmp_path)) for d in run_dirs]
    for out in outputs:
        assert "[launch]   trainer (grpo): batch_size=4 " in out and " weight_sync=none" in out
        assert "[launch]   env crashy: crashy_env.py" in out  # relative to where it runs
    for run_dir in run_dirs:
        # each launch's own trainer wrote its summary, and its launcher completed it
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["stopped"] == "error" and summary["failed_part"] == "crashy"
        assert summary["steps"] == 0 and "wall_seconds" in summary
        assert json.loads((run_dir / "trainer_config.json").read_text())["run_dir"] == str(run_dir.relative_to(tmp_path))
        assert {"api.log", "trainer.log", "crashy.log"} <= {p.name for p in (run_dir / "logs").iterdir()}
        assert (run_dir / "logs" / "trainer.log").read_text().count("[grpo] run directory:") == 1


QUICKSTART = REPO / "configs/quickstart-cpu.yaml"


@pytest.mark.parametrize(("override", "message"), [
    ("trainer.max_train_secondz=170", "trainer.max_train_secondz: unknown key; did you mean trainer.max_train_seconds"),
    ("envs.arithmetic.args.env.group_sise=4",
     "envs.arithmetic.args.env.group_sise: unknown flag; did you mean envs.arithmetic.args.env.group_size?"),
    ("envs.arithmetc.args.env.group_size=4", "no envs entry is named 'arithmetc'; did you mean arithmetic?"),
    ("traner.lr=1", "traner: unknown key; did you mean trainer"),
    ("trainer.max_train_seconds=soon", "trainer.max_train_seconds: Input should be a valid number"),
    ("trainer.batch_size=12", "batch_size 12 is not a multiple of group_size 8"),
    ("trainer.max_train_seconds", "expected KEY=VALUE"),
])
def test_a_bad_set_is_refused_like_the_yaml_before_anything_starts(tmp_path, monkeypatch, capsys,
                                                                    override, message):
    monkeypatch.chdir(tmp_path)
    assert main([str(QUICKSTART), "--set", override]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "runs").exists()  # refused before a run directory, let alone a part


def test_set_overrides_the_yaml_before_validation():
    config = load_config(QUICKSTART, ["trainer.max_train_seconds=170", "envs.arithmetic.args.env.group_size=4",
                                      "trainer.batch_size=8", "api.port=9123", "trainer.gradient_checkpointing=false"])
    assert config.trainer["max_train_seconds"] == 170 and config.trainer["batch_size"] == 8
    assert config.trainer["gradient_checkpointing"] is False  # YAML values, not strings
    assert config.envs[0].args["env.group_size"] == 4 and config.envs[0].args["env.difficulty"] == 2
    assert config.api.port == 9123
    # a later --set wins; the trainer's placement is reached through its nested key
    config = load_config(QUICKSTART, ["trainer.lr=1e-4", "trainer.lr=2.0e-4", "trainer.placement.num_cpus=2"])
    assert config.trainer["lr"] == 2.0e-4 and config.trainer_placement.num_cpus == 2
    lines = describe_config(load_config(QUICKSTART, ["trainer.max_train_seconds=170",
                                                     "envs.arithmetic.args.env.group_size=4"]))
    text = " ".join(lines)
    assert lines[0].startswith("trainer (grpo): training_steps=400 max_train_seconds=170")
    assert "env arithmetic: " in text and "env.group_size=4" in text and "eval_env: arithmetic" in text


def test_an_unquoted_yaml_no_reaches_the_trainer_as_the_word():
    config = load_config(QUICKSTART, ["trainer.mixed_precision=no", "trainer.gradient_checkpointing=no"])
    assert config.trainer["mixed_precision"] == "no"  # the field's word, not --no-mixed-precision
    assert config.trainer["gradient_checkpointing"] is False  # a bool field stays a bool
    flags = trainer_flags(config.trainer_settings)
    assert flags[flags.index("--mixed-precision") + 1] == "no" and "--no-gradient-checkpointing" in flags


def test_make_quickstart_budget_passes_a_set_through():
    def recipe(*args):
        out = subprocess.run(["make", "-n", "quickstart", *args], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout
        return next(line for line in out.splitlines() if "atropos-launch" in line)

    assert recipe("BUDGET=170").endswith("atropos-launch configs/quickstart-cpu.yaml --set trainer.max_train_seconds=170")
    assert "--set" not in recipe()
