"""The ``atropos-launch`` YAML schema: its sections, loading, validation and pre-flight checks."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from atroposlib.api.packing import batch_size_problem
from atroposlib.errors import ConfigError
from atroposlib.launch.commands import flags
from atroposlib.launch.trainers import DEFAULT_TRAINER, load_trainer
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
    ``trainer_name`` names (see :mod:`atroposlib.launch.trainers`).

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
    checks = [env_arg_check(env) for env in config.envs]
    problems += [p for check in checks for p in check.problems]
    # group_size as each env will run with it (its own parse: YAML value or config_init default)
    group_sizes = [check.group_size for check in checks]
    batch_size = getattr(trainer_config, "batch_size", None)
    if isinstance(batch_size, int) and all(isinstance(g, int) for g in group_sizes):
        problem = batch_size_problem(batch_size, group_sizes)  # type: ignore[arg-type]
        if problem is not None:
            problems.append(f"trainer.batch_size and the envs' group_size do not fit: {problem}")
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


@dataclass(frozen=True)
class EnvArgCheck:
    """One env's ``args`` parsed by its own command line, as ``serve`` will parse them.

    Attributes:
        problems: one line per problem, named by its full key path
            (``envs.<name>.args.env.group_size``); an unknown flag with the closest known ones.
        group_size: the group size the env will run with (from ``args`` or its
            ``config_init``); None when the script could not be checked.
    """

    problems: list[str] = field(default_factory=list)
    group_size: int | None = None


def env_arg_check(env: EnvSection, timeout: float = 30.0) -> EnvArgCheck:
    """Parse one env's ``args`` with its script's own parser, as ``serve`` will.

    The launcher reads the env's settings from this one parse, never from the raw ``args``
    (which may leave a setting to the env's defaults). The script is imported (not run) in a
    child Python, so its top-level code cannot affect the launcher, to find the ``BaseEnv``
    subclass it defines. A script that cannot be imported, takes longer than ``timeout``
    seconds, or defines none or several env classes is not checked here (its own start-up
    still reports its problems): the check is empty.
    """
    import json

    code = ("import json, sys; from atroposlib.launch.config import EnvSection, _env_arg_check; "
            "print(json.dumps(_env_arg_check(EnvSection.model_validate_json(sys.argv[1]))))")
    try:
        child = subprocess.run([sys.executable, "-c", code, env.model_dump_json()],
                               capture_output=True, text=True, timeout=timeout,
                               env={**OFFLINE_ENV, **os.environ})
        lines = child.stdout.strip().splitlines()
        found = json.loads(lines[-1]) if child.returncode == 0 and lines else {}
    except (subprocess.TimeoutExpired, ValueError):
        return EnvArgCheck()
    if not isinstance(found, dict):
        return EnvArgCheck()
    size = found.get("group_size")
    return EnvArgCheck([str(p) for p in found.get("problems") or []], size if isinstance(size, int) else None)


def env_arg_problems(env: EnvSection, timeout: float = 30.0) -> list[str]:
    """The problems of :func:`env_arg_check` (one line each, by full key path)."""
    return env_arg_check(env, timeout).problems


def _env_arg_check(env: EnvSection) -> dict[str, Any]:
    """:func:`env_arg_check` in this process (it imports the env script); a JSON-able dict."""
    import importlib.util
    import inspect

    from atroposlib.env_runtime.command_line import build_command, build_parser
    from atroposlib.envs.base import BaseEnv

    where = f"envs.{env.name}.args"
    spec = importlib.util.spec_from_file_location(f"_atropos_launch_check_{env.name}", env.script)
    if spec is None or spec.loader is None:
        return {}
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException:  # noqa: BLE001 - its own start-up will report the script's failure
        return {}
    envs = [c for c in vars(module).values() if inspect.isclass(c) and issubclass(c, BaseEnv)
            and not inspect.isabstract(c) and not c.__module__.startswith("atroposlib.envs.")]
    # The class the script defines; else the one it imports (a checkout's environments/X.py
    # launcher imports its class from atroposlib.environments).
    classes = [c for c in envs if c.__module__ == module.__name__] or envs
    if len(classes) != 1:
        return {}
    defaults = classes[0].config_init()
    parser = build_parser(classes[0], defaults)
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
        return {"problems": problems}
    try:
        namespace, _ = parser.parse_known_args(["serve", *flags(env.args)])
        command = build_command(classes[0], "serve", namespace, defaults)
    except ConfigError as exc:
        return {"problems": [f"{where}: {line.strip()}" for line in str(exc).splitlines()
                             if line.strip() and not line.strip().startswith("invalid env configuration")]}
    return {"problems": [], "group_size": command.env_config.group_size}


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
