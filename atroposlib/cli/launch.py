"""``atropos-launch CONFIG.yaml``: run-api, the GRPO trainer (which owns vLLM) and the envs, as one command.

Order: ``run-api`` (waits for ``GET /info``) -> trainer (launches vLLM, evaluates the starting
policy, registers) -> once the API reports the trainer's registration, every environment in
``serve`` mode -> wait for the trainer to finish -> stop everything.

Every process runs in its own process group; its output goes to
``<run_dir>/logs/<name>.log`` and to the console prefixed with ``[name]``. On Ctrl-C, SIGTERM,
the trainer finishing, or any part dying early, every process (and anything it spawned, e.g.
vLLM) gets SIGTERM, then SIGKILL after ``stop_timeout`` seconds. Nothing else is touched.

Example config (``configs/quickstart-cpu.yaml`` is the full one)::

    trainer:                  # any atropos-grpo flag, snake_case
      training_steps: 20
      batch_size: 32
      lr: 2.0e-5
    envs:
      - name: arithmetic
        script: environments/arithmetic_server.py
        args: {env.group_size: 8, env.difficulty: 2}
    eval_env: arithmetic       # evaluate before/after training with this env's `evaluate`
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from atroposlib.api.packing import batch_size_problem
from atroposlib.cli.trainers import DEFAULT_TRAINER, load_trainer
from atroposlib.defaults import DEFAULT_INFERENCE_MODEL
from atroposlib.errors import AtroposError, ConfigError
from atroposlib.utils.offline import OFFLINE_ENV
from atroposlib.utils.yaml_file import load_yaml


class ApiSection(BaseModel):
    """How to run ``run-api``."""

    model_config = ConfigDict(extra="forbid")

    port: int | None = Field(default=None, description="Port (default: a free one).")
    extra_args: list[str] = Field(default_factory=list, description="More run-api flags.")
    start_timeout: float = Field(default=60.0, gt=0, description="Seconds to wait for GET /info.")


class EnvSection(BaseModel):
    """One environment started in ``serve`` mode."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Log name ([name] prefix, logs/<name>.log); unique.")
    script: str = Field(description="Environment script, e.g. environments/arithmetic_server.py "
                        "(relative paths are resolved against the config file's directory, "
                        "then the working directory).")
    args: dict[str, Any] = Field(default_factory=dict, description="Flags without the leading "
                                 "dashes, e.g. {env.group_size: 8}; true = bare flag.")
    server_type: str = Field(default="vllm", description="--openai.server_type used to reach "
                             "the trainer's vLLM.")


class LaunchConfig(BaseModel):
    """The whole ``atropos-launch`` YAML file."""

    model_config = ConfigDict(extra="forbid")

    run_dir: str | None = Field(default=None, description="Run directory (default: "
                                "runs/<UTC timestamp>).")
    api: ApiSection = Field(default_factory=ApiSection, description="run-api settings.")
    trainer_name: str = Field(default=DEFAULT_TRAINER, description="Which registered trainer "
                              "runs (entry-point group atroposlib.trainers); pip install -e . "
                              "registers grpo.")
    trainer: dict[str, Any] = Field(default_factory=dict, description="The trainer's settings "
                                    "(for grpo: atropos-grpo's, snake_case); api_url, run_dir and vllm_port are "
                                    "filled in by the launcher. With vllm_url the envs use that "
                                    "server and the trainer launches none. nproc_per_node: N "
                                    "(> 1) runs the trainer as N FSDP processes under torchrun.")
    envs: list[EnvSection] = Field(min_length=1, description="Environments to serve.")
    eval_env: str | None = Field(default=None, description="Name of the env whose `evaluate` "
                                 "runs before/after training (sets trainer.eval_command).")
    eval_args: dict[str, Any] = Field(default_factory=dict, description="Extra flags for that "
                                      "evaluate command (default: the env's args).")
    register_timeout: float = Field(default=1200.0, gt=0, description="Seconds to wait for the "
                                    "trainer to register (vLLM start + baseline eval).")
    stop_timeout: float = Field(default=30.0, gt=0, description="Seconds between SIGTERM and "
                                "SIGKILL when stopping a part.")

    @model_validator(mode="after")
    def _check(self) -> LaunchConfig:
        names = [e.name for e in self.envs]
        if len(set(names)) != len(names):
            raise ValueError(f"env names must be unique, got {names}; rename the duplicates")
        if self.eval_env is not None and self.eval_env not in names:
            raise ValueError(f"eval_env {self.eval_env!r} is not one of the envs {names}")
        for key in ("api_url", "run_dir", "vllm_port"):
            if key in self.trainer:
                raise ValueError(f"trainer.{key} is set by atropos-launch; remove it from the "
                                 "config (use api.port / run_dir instead)")
        nproc = self.trainer.get("nproc_per_node", 1)
        if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
            raise ValueError(f"trainer.nproc_per_node must be a whole number >= 1 (training "
                             f"processes on this node), got {nproc!r}")
        return self


def load_config(path: str | Path) -> LaunchConfig:
    """Read and validate a launch YAML file.

    The ``trainer:`` section is checked against the settings model of the trainer that
    ``trainer_name`` names (see :mod:`atroposlib.cli.trainers`).

    Raises:
        ConfigError: the file is missing, not YAML, names no registered trainer, or fails
            validation (message lists every problem with its key path).
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist; see configs/quickstart-cpu.yaml")
    data = load_yaml(path)
    trainer_name = data.get("trainer_name", DEFAULT_TRAINER)
    # a trainer_name that is not a string is reported with the other LaunchConfig problems
    trainer_config_model = None
    if isinstance(trainer_name, str):
        try:
            trainer_config_model = load_trainer(trainer_name).config_model
        except ConfigError as exc:
            raise type(exc)(f"{path}: {exc}") from exc
    # every section is validated before reporting, so one run shows every problem
    problems: list[str] = []
    config = None
    try:
        config = LaunchConfig.model_validate(data)
    except ValidationError as exc:
        problems += _validation_problems(exc, "", LaunchConfig)
    trainer = data.get("trainer") if isinstance(data.get("trainer"), dict) else {}
    trainer = {k: v for k, v in trainer.items()
               if k not in ("nproc_per_node", "api_url", "run_dir", "vllm_port")}
    trainer_config = None
    if trainer_config_model is not None:
        try:
            trainer_config = trainer_config_model.model_validate(
                {**trainer, "api_url": "http://x", "run_dir": "x"})
        except ValidationError as exc:
            problems += _validation_problems(exc, "trainer.", trainer_config_model)
    if config is None:
        raise ConfigError(f"{path}: invalid launch config:\n  " + "\n  ".join(problems))
    group_sizes = [env.args.get("env.group_size") for env in config.envs]
    batch_size = getattr(trainer_config, "batch_size", None)
    if isinstance(batch_size, int) and all(isinstance(g, int) for g in group_sizes):
        problem = batch_size_problem(batch_size, group_sizes)
        if problem is not None:
            problems.append(f"trainer.batch_size and envs[].args env.group_size do not fit: {problem}")
    base = path.resolve().parent
    for env in config.envs:
        script = Path(env.script)
        if not script.is_absolute():
            for root in (base, base.parent, Path.cwd()):
                if (root / script).exists():
                    script = root / script
                    break
        if not script.exists():
            raise ConfigError(f"{path}: env {env.name!r}: script {env.script} not found "
                              f"(looked next to the config and in {Path.cwd()})")
        env.script = str(script.resolve())
    problems += [p for env in config.envs for p in env_arg_problems(env)]
    if problems:
        raise ConfigError(f"{path}: invalid launch config:\n  " + "\n  ".join(problems))
    return config


def _closest(key: str, known: list[str]) -> list[str]:
    """Up to 3 known names close to ``key``.

    Similar spelling, or else a known name that starts it (``lr_rate`` -> ``lr``).
    """
    import difflib

    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    if not close:
        close = [k for k in known if len(k) >= 2 and key.startswith(k)][:3]
    return close


def _validation_problems(exc: ValidationError, prefix: str, model: type[BaseModel]) -> list[str]:
    """One line per pydantic error.

    Each names the key's full path (``trainer.lr``) and what is wrong, and for an unknown key
    the closest known ones.
    """
    sections = {"api": ApiSection, "envs": EnvSection}
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        where = prefix + ".".join(loc) if loc else prefix.rstrip(".") or "<root>"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            owner = model
            if not prefix and loc and loc[0] in sections:
                owner = sections[loc[0]]
            close = _closest(loc[-1], list(owner.model_fields))
            message = "unknown key" + (
                f"; did you mean {' or '.join(prefix + '.'.join([*loc[:-1], c]) for c in close)}?"
                if close else "; see `atropos-grpo --help`" if prefix == "trainer." else
                f"; known keys: {', '.join(owner.model_fields)}")
        lines.append(f"{where}: {message}")
    return lines


def env_arg_problems(env: EnvSection, timeout: float = 30.0) -> list[str]:
    """Validate one env's ``args`` against its script's env class, as ``serve`` would parse them.

    The script is imported (not run) in a child Python, so its top-level code cannot affect the
    launcher, to find the ``BaseEnv`` subclass it defines. A script that cannot be imported,
    takes longer than ``timeout`` seconds, or defines none or several env classes is not
    checked here (its own start-up still reports its problems).

    Returns:
        One line per problem, named by its full key path (``envs.<name>.args.env.group_size``),
        an unknown flag with the closest known ones.
    """
    import json

    code = ("import json, sys; from atroposlib.cli.launch import EnvSection, _env_arg_problems; "
            "print(json.dumps(_env_arg_problems(EnvSection.model_validate_json(sys.argv[1]))))")
    try:
        child = subprocess.run([sys.executable, "-c", code, env.model_dump_json()],
                               capture_output=True, text=True, timeout=timeout,
                               env={**OFFLINE_ENV, **os.environ})
        lines = child.stdout.strip().splitlines()
        problems = json.loads(lines[-1]) if child.returncode == 0 and lines else []
    except (subprocess.TimeoutExpired, ValueError):
        return []
    return [str(p) for p in problems] if isinstance(problems, list) else []


def _env_arg_problems(env: EnvSection) -> list[str]:
    """:func:`env_arg_problems` in this process (it imports the env script)."""
    import importlib.util
    import inspect

    from atroposlib.env_runtime.commands import build_configs, build_parser
    from atroposlib.envs.base import BaseEnv

    where = f"envs.{env.name}.args"
    spec = importlib.util.spec_from_file_location(f"_atropos_launch_check_{env.name}", env.script)
    if spec is None or spec.loader is None:
        return []
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException:  # noqa: BLE001 - its own start-up will report the script's failure
        return []
    envs = [c for c in vars(module).values() if inspect.isclass(c) and issubclass(c, BaseEnv)
            and not inspect.isabstract(c) and not c.__module__.startswith("atroposlib.envs.")]
    # The class the script defines; else the one it imports (a checkout's environments/X.py
    # launcher imports its class from atroposlib.environments).
    classes = [c for c in envs if c.__module__ == module.__name__] or envs
    if len(classes) != 1:
        return []
    parser = build_parser(classes[0])
    mode_parser = parser.mode_parsers["serve"]  # type: ignore[attr-defined]

    def _raise(message: str) -> None:
        raise ConfigError(message)

    for p in (parser, mode_parser):
        p.error = _raise  # type: ignore[method-assign]
    known = sorted(s[2:] for a in mode_parser._actions for s in a.option_strings if s.startswith("--"))
    problems = []
    for key in env.args:
        if key not in known:
            close = _closest(key, known)
            problems.append(f"{where}.{key}: unknown flag" + (
                f"; did you mean {' or '.join(f'{where}.{c}' for c in close)}?" if close
                else f"; see `python {env.script} serve --help`"))
    if problems:
        return problems
    try:
        namespace, _ = parser.parse_known_args(["serve", *flags(env.args)])
        build_configs(classes[0], "serve", namespace)
    except ConfigError as exc:
        return [f"{where}: {line.strip()}" for line in str(exc).splitlines()
                if line.strip() and not line.strip().startswith("invalid env configuration")]
    return []


def launch_preflight(config: LaunchConfig) -> None:
    """Check the trainer's model path, the envs' tokenizer paths and a fixed ``api.port``.

    Runs before anything starts.

    Raises:
        PreflightError: one line per problem, each with its fix.
    """
    from atroposlib.utils import preflight as pf

    problems = [pf.check_model_path(config.trainer.get("model"), "trainer.model")]
    for env in config.envs:
        tokenizer = env.args.get("env.tokenizer_name")
        problems.append(pf.check_model_path(tokenizer, f"envs.{env.name}.args.env.tokenizer_name",
                                            "tokenizer"))
    if config.api.port:
        problems.append(pf.check_port_free("127.0.0.1", config.api.port,
                                           f"another run-api? stop it or set api.port: "
                                           f"{config.api.port + 1}"))
    pf.raise_on_problems(problems)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flags(args: dict[str, Any]) -> list[str]:
    """``{"env.group_size": 8, "slurm": True, "env.use_wandb": False}`` -> env CLI flags.

    Gives ``["--env.group_size", "8", "--slurm", "--env.use_wandb", "false"]``; None is skipped.
    """
    out: list[str] = []
    for key, value in args.items():
        if value is True:
            out.append(f"--{key}")
        elif value is False:
            out += [f"--{key}", "false"]
        elif value is None:
            continue
        else:
            out += [f"--{key}", str(value)]
    return out


def trainer_flags(values: dict[str, Any]) -> list[str]:
    """TrainerConfig values -> ``atropos-grpo`` kebab-case flags (lists as JSON)."""
    import json

    out: list[str] = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        elif value is None:
            continue
        elif isinstance(value, list | tuple | dict):
            out += [flag, json.dumps(value)]
        else:
            out += [flag, str(value)]
    return out


def trainer_command(run_module: str, nproc_per_node: int) -> list[str]:
    """The argv that starts the trainer: ``python -m run_module`` for 1 process, torchrun for more.

    Args:
        run_module: the trainer's module (its settings model's ``run_module``).
        nproc_per_node: training processes on this node. ``torch.distributed.run --standalone``
            gives them a local rendezvous on a free port; the trainer sees ``WORLD_SIZE`` (the
            GRPO trainer then shards the policy with FSDP).
    """
    if nproc_per_node <= 1:
        return [sys.executable, "-m", run_module]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(nproc_per_node), "-m", run_module]


class Part:
    """One child process: own process group, output to a log file and the prefixed console."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str],
                 console: TextIO, console_lock: threading.Lock):
        """Start ``argv`` now.

        Args:
            name: prefix and log-file name.
            argv: the command.
            log_dir: where ``<name>.log`` goes.
            env: full environment of the child.
            console: stream for prefixed output (stdout).
            console_lock: serialises console lines from all parts.
        """
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115
        self._log.write(f"$ {shlex.join(argv)}\n".encode())
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        self._descendants: dict[int, Any] = {}
        self._reader = threading.Thread(target=self._pump, args=(console, console_lock),
                                        daemon=True, name=f"log-{name}")
        self._reader.start()

    def _pump(self, console: TextIO, lock: threading.Lock) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            self._log.write(raw)
            line = raw.decode(errors="replace").rstrip("\n")
            # tqdm progress bars redraw with \r; show only the final state of the line
            line = line.split("\r")[-1]
            with lock:
                console.write(f"[{self.name}] {line}\n")
                console.flush()

    def poll(self) -> int | None:
        """Exit code, or None while running."""
        return self.proc.poll()

    def remember_descendants(self) -> None:
        """Record the pids this part spawned (e.g. vLLM in its own group) to stop them later."""
        import psutil

        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self._descendants[child.pid] = child
        except psutil.Error:
            pass

    def tail(self, chars: int = 4000) -> str:
        """The last ``chars`` characters of this part's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the part's process group (ignored when already gone)."""
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout: float) -> int | None:
        """SIGTERM the group and recorded descendants; SIGKILL what is left after ``timeout``."""
        import psutil

        self.remember_descendants()
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
        for proc in list(self._descendants.values()):
            try:
                proc.terminate()
            except psutil.Error:
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.proc.wait(10)
        alive = []
        for proc in self._descendants.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.Error:
                pass
        _, still = psutil.wait_procs(alive, timeout=timeout)
        for proc in still:
            try:
                proc.kill()
            except psutil.Error:
                pass
        self._reader.join(5)
        self._log.close()
        return self.proc.returncode


class LaunchError(AtroposError, RuntimeError):
    """A part failed to come up or died early (the message has its log tail)."""


class Launcher:
    """Runs the parts of one training run and always stops them all (see module docstring)."""

    def __init__(self, config: LaunchConfig, console: TextIO | None = None):
        """Resolve the trainer and prepare the run directory; nothing starts until :meth:`run`.

        Raises:
            ConfigError: ``config.trainer_name`` names no registered trainer.
        """
        self.config = config
        self.trainer_module = load_trainer(config.trainer_name).run_module
        self.run_dir = Path(config.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
        self.log_dir = self.run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.console = console or sys.stdout
        self.lock = threading.Lock()
        self.parts: list[Part] = []
        self.env = {**OFFLINE_ENV, **os.environ}
        self._stop_signal: int | None = None

    def say(self, message: str) -> None:
        """Print a ``[launch]`` line."""
        with self.lock:
            self.console.write(f"[launch] {message}\n")
            self.console.flush()

    def start(self, name: str, argv: list[str]) -> Part:
        """Start one part and remember it for shutdown."""
        part = Part(name, argv, self.log_dir, self.env, self.console, self.lock)
        self.parts.append(part)
        self.say(f"started {name} (pid {part.proc.pid}): {shlex.join(argv)}")
        return part

    def _fail(self, part: Part, why: str) -> LaunchError:
        return LaunchError(f"{part.name} {why}; last lines of {part.log_path}:\n{part.tail()}")

    def _wait_until(self, what: str, check: Any, timeout: float, watch: list[Part]) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self._stop_signal is not None:
                raise KeyboardInterrupt
            for part in watch:
                if part.poll() is not None:
                    raise self._fail(part, f"exited with code {part.poll()} while waiting for {what}")
            if check():
                return
            if time.monotonic() > deadline:
                raise self._fail(watch[-1], f"did not reach '{what}' within {timeout:.0f}s")
            time.sleep(0.5)

    def run(self) -> int:
        """Run everything; return the trainer's exit code (130 on Ctrl-C, 1 on failure)."""
        import httpx

        cfg = self.config
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            # 1. run-api
            api_port = cfg.api.port or free_port()
            api_url = f"http://127.0.0.1:{api_port}"
            api = self.start("api", [sys.executable, "-m", "atroposlib.cli.run_api", "--host",
                                     "127.0.0.1", "--port", str(api_port), *cfg.api.extra_args])

            def info() -> dict[str, Any] | None:
                try:
                    response = httpx.get(f"{api_url}/info", timeout=2.0, trust_env=False)
                    return response.json() if response.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    return None

            self._wait_until("GET /info answers", lambda: info() is not None,
                             cfg.api.start_timeout, [api])
            self.say(f"run-api ready at {api_url}")

            # 2. trainer (launches vLLM itself, evaluates, then registers)
            trainer_values = dict(cfg.trainer)
            nproc = trainer_values.pop("nproc_per_node", 1)
            port_flags: list[str] = []
            if trainer_values.get("vllm_url"):  # an already-running vLLM (e.g. in tests)
                base_url = str(trainer_values["vllm_url"]).rstrip("/")
            else:  # the trainer launches vLLM on a port chosen here, so the envs know it
                vllm_port = free_port()
                base_url = f"http://127.0.0.1:{vllm_port}/v1"
                port_flags = ["--vllm-port", str(vllm_port)]
            model_name = trainer_values.get("served_model_name", DEFAULT_INFERENCE_MODEL)
            eval_env = next((e for e in cfg.envs if e.name == cfg.eval_env), None)
            if eval_env is not None and "eval_command" not in trainer_values:
                eval_args = {**eval_env.args, **cfg.eval_args}
                eval_args = {k: v for k, v in eval_args.items()
                             if k not in ("env.rollout_server_url", "env.data_dir_to_save_evals")}
                if trainer_values.get("model") and "env.tokenizer_name" not in eval_args:
                    eval_args["env.tokenizer_name"] = trainer_values["model"]
                trainer_values["eval_command"] = " ".join([
                    shlex.quote(sys.executable), shlex.quote(eval_env.script), "evaluate",
                    *map(shlex.quote, flags(eval_args)),
                    "--openai.server_type", shlex.quote(eval_env.server_type),
                    "--openai.base_url", "{base_url}", "--openai.model_name", "{model_name}",
                    "--env.data_dir_to_save_evals", "{out_dir}",
                ])
            trainer = self.start("trainer", [
                *trainer_command(self.trainer_module, nproc), *trainer_flags(trainer_values),
                "--api-url", api_url, "--run-dir", str(self.run_dir), *port_flags])
            self._wait_until("trainer registered with run-api",
                             lambda: (info() or {}).get("batch_size", -1) > 0,
                             cfg.register_timeout, [api, trainer])
            trainer.remember_descendants()
            self.say("trainer registered; starting environments")

            # 3. environments
            envs = []
            model_dir = trainer_values.get("model")
            for env in cfg.envs:
                extra = {"env.rollout_server_url": api_url, "openai.base_url": base_url,
                         "openai.model_name": model_name, "openai.server_type": env.server_type}
                if model_dir and "env.tokenizer_name" not in env.args:
                    extra["env.tokenizer_name"] = model_dir
                envs.append(self.start(env.name, [sys.executable, env.script, "serve",
                                                  *flags({**env.args, **extra})]))

            # 4. wait for the trainer
            while trainer.poll() is None:
                if self._stop_signal is not None:
                    raise KeyboardInterrupt
                for part in [api, *envs]:
                    if part.poll() is not None:
                        raise self._fail(part, f"exited early with code {part.poll()}")
                trainer.remember_descendants()
                time.sleep(1.0)
            code = trainer.poll()
            if code != 0:
                raise self._fail(trainer, f"exited with code {code}")
            self.say(f"trainer finished; results in {self.run_dir} (summary.json, plot.png)")
            return 0
        except KeyboardInterrupt:
            self.say("interrupted: stopping every part")
            return 130
        except LaunchError as exc:
            self.say(f"FAILED: {exc}")
            return 1
        finally:
            self.shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._stop_signal is not None:
            raise KeyboardInterrupt
        self._stop_signal = signum

    def shutdown(self) -> None:
        """Stop every part, newest first (envs, trainer + vLLM, api)."""
        for part in reversed(self.parts):
            code = part.stop(self.config.stop_timeout)
            self.say(f"stopped {part.name} (exit code {code})")


def main(argv: list[str] | None = None) -> int:
    """Console script ``atropos-launch CONFIG.yaml [--run-dir DIR]``."""
    from atroposlib.utils.cli import ArgumentParser

    parser = ArgumentParser(
        prog="atropos-launch",
        description="Run run-api, the GRPO trainer (with its vLLM) and the environments from one "
        "YAML file; logs go to <run_dir>/logs/<name>.log and the console.")
    parser.add_argument("config", help="launch YAML, e.g. configs/quickstart-cpu.yaml")
    parser.add_argument("--run-dir", default=None, help="override run_dir from the config")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        launch_preflight(config)
    except ConfigError as exc:
        print(f"atropos-launch: {exc}", file=sys.stderr)
        return 2
    if args.run_dir:
        config.run_dir = args.run_dir
    return Launcher(config).run()


if __name__ == "__main__":
    raise SystemExit(main())
