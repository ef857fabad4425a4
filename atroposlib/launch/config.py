"""The ``atropos-launch`` YAML schema: its sections, loading, validation and pre-flight checks."""

from __future__ import annotations

import os
import re
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

#: Keys of the ``trainer:`` section that atropos-launch reads itself (not trainer settings).
LAUNCHER_TRAINER_KEYS = ("nproc_per_node", "nnodes", "placement")
#: Keys of the ``trainer:`` section that atropos-launch fills in.
FILLED_TRAINER_KEYS = ("api_url", "run_dir", "vllm_port")


class Placement(BaseModel):
    """Where a part runs on a Ray cluster (``--ray``); ignored when the parts run locally.

    Each field is Ray's own actor option of the same meaning: the part is a Ray actor that
    asks for these resources, so Ray's scheduler picks the node.
    """

    model_config = ConfigDict(extra="forbid")

    num_cpus: float = Field(default=1, ge=0, description="Logical CPUs the part holds on its "
                            "node. Ray also sets the part's OMP_NUM_THREADS to it (at least 1).")
    num_gpus: float = Field(default=0, ge=0, description="GPUs the part holds; Ray sets its "
                            "CUDA_VISIBLE_DEVICES to the ones it got.")
    memory: int | None = Field(default=None, gt=0, description="Bytes of memory to reserve "
                               "(a scheduling hint; Ray does not enforce it).")
    resources: dict[str, float] = Field(default_factory=dict, description="Custom resources, "
                                        "e.g. {node_b: 1} for a node started with `ray start "
                                        "--resources '{\"node_b\": 1}'`.")
    labels: dict[str, str] = Field(default_factory=dict, description="Node labels the node "
                                   "must carry (Ray's label_selector), e.g. {ray.io/node-id: "
                                   "ID} or a label set with `ray start --labels`.")
    runtime_env: dict[str, Any] = Field(default_factory=dict, description="Ray runtime env of "
                                        "this part, merged over ray.runtime_env.")

    def actor_options(self, base_runtime_env: dict[str, Any] | None = None) -> dict[str, Any]:
        """Keyword arguments for Ray's ``ActorClass.options(...)``.

        Args:
            base_runtime_env: the run-wide runtime env (``ray.runtime_env``); this part's keys
                win, and their ``env_vars`` are merged.
        """
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory is not None:
            options["memory"] = self.memory
        if self.resources:
            options["resources"] = dict(self.resources)
        if self.labels:
            options["label_selector"] = dict(self.labels)
        runtime_env = {**(base_runtime_env or {}), **self.runtime_env}
        env_vars = {**(base_runtime_env or {}).get("env_vars", {}), **self.runtime_env.get("env_vars", {})}
        if env_vars:
            runtime_env["env_vars"] = env_vars
        if runtime_env:
            options["runtime_env"] = runtime_env
        return options


class RaySection(BaseModel):
    """Run every part as a Ray actor on a running Ray cluster (``atropos-launch CONFIG --ray``)."""

    model_config = ConfigDict(extra="forbid")

    address: str = Field(default="auto", description="Ray cluster address for ray.init: "
                         "'auto' (the cluster this host belongs to, or $RAY_ADDRESS), "
                         "HOST:PORT of the head's GCS, or ray://HOST:10001 (Ray Client).")
    node_run_dir: str | None = Field(default=None, description="Directory under which each "
                                     "part writes on its own node (default: the node's temp "
                                     "dir + /atropos-runs); the run's name is appended.")
    runtime_env: dict[str, Any] = Field(default_factory=dict, description="Ray runtime env for "
                                        "every part, e.g. {env_vars: {HF_HOME: /data/hf}} or "
                                        "{working_dir: .} when the code is not on every node.")
    namespace: str | None = Field(default=None, description="Ray namespace of the run's actors.")
    place_timeout: float = Field(default=300.0, gt=0, description="Seconds Ray may take to find "
                                 "a node for a part (longer on clusters that scale up).")


class InferenceSection(BaseModel):
    """Inference nodes: ``atropos-inference-node`` servers the trainer pushes each policy to.

    The trainer then launches no vLLM of its own: it gets every node's URL in ``--vllm-url``
    and sends new weights over HTTP (or as a local file when a node shares its host and run
    directory); the environments sample from all the nodes.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="inference", description="Log name; with count > 1 the nodes are "
                      "<name>.0, <name>.1, ...")
    count: int = Field(default=1, ge=1, description="How many nodes of this kind.")
    model: str | None = Field(default=None, description="Model to serve (default: trainer.model, "
                              "or the bundled one); it must be the trainer's starting model.")
    args: dict[str, Any] = Field(default_factory=dict, description="atropos-inference-node "
                                 "flags in snake_case, e.g. {dtype: bfloat16, max_model_len: 512}; "
                                 "host, port, model and served_model_name are set by the launcher.")
    vllm_args: list[str] = Field(default_factory=list, description="Flags passed to vLLM "
                                 "unchanged (after --), e.g. [--max-num-seqs, '64'].")
    placement: Placement = Field(default_factory=Placement, description="Where each node runs "
                                 "under --ray.")
    start_timeout: float = Field(default=900.0, gt=0, description="Seconds to wait for each "
                                 "node's GET /health.")

    @property
    def names(self) -> list[str]:
        """The log names of this section's nodes."""
        return [self.name] if self.count == 1 else [f"{self.name}.{i}" for i in range(self.count)]


class ApiSection(BaseModel):
    """How to run ``run-api``."""

    model_config = ConfigDict(extra="forbid")

    port: int | None = Field(default=None, description="Port (default: a free one).")
    extra_args: list[str] = Field(default_factory=list, description="More run-api flags.")
    start_timeout: float = Field(default=60.0, gt=0, description="Seconds to wait for GET /info.")
    placement: Placement = Field(default_factory=Placement, description="Where run-api runs "
                                 "under --ray.")


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
    placement: Placement = Field(default_factory=Placement, description="Where this env runs "
                                 "under --ray.")


class LaunchConfig(BaseModel):
    """The whole ``atropos-launch`` YAML file."""

    model_config = ConfigDict(extra="forbid")

    run_dir: str | None = Field(default=None, description="Run directory; it must "
                                "hold no run yet (default: a new runs/<UTC timestamp>, with -2, -3, "
                                "... when a run of the same second has that name).")
    api: ApiSection = Field(default_factory=ApiSection, description="run-api settings.")
    trainer_name: str = Field(default=DEFAULT_TRAINER, description="Which registered trainer "
                              "runs (entry-point group atroposlib.trainers); pip install -e . "
                              "registers grpo.")
    trainer: dict[str, Any] = Field(default_factory=dict, description="The trainer's settings "
                                    "(for grpo: atropos-grpo's, snake_case); api_url, run_dir and vllm_port are "
                                    "filled in by the launcher. With vllm_url (one URL, or several "
                                    "comma-separated) the envs use those servers and the "
                                    "trainer launches none. nproc_per_node: N "
                                    "(> 1) runs the trainer as N FSDP processes under torchrun; "
                                    "under --ray, nnodes: M runs it on M nodes (M x N ranks) and "
                                    "placement: {...} places each node's share.")
    envs: list[EnvSection] = Field(min_length=1, description="Environments to serve.")
    inference: list[InferenceSection] = Field(default_factory=list, description="Inference "
                                              "nodes (atropos-inference-node) the trainer pushes "
                                              "weights to; empty: the trainer launches its own vLLM.")
    eval_env: str | None = Field(default=None, description="Name of the env whose `evaluate` "
                                 "runs before/after training (sets trainer.eval_command).")
    eval_args: dict[str, Any] = Field(default_factory=dict, description="Extra flags for that "
                                      "evaluate command (default: the env's args).")
    register_timeout: float = Field(default=1200.0, gt=0, description="Seconds to wait for the "
                                    "trainer to register (vLLM start + baseline eval).")
    stop_timeout: float = Field(default=30.0, gt=0, description="Seconds between SIGTERM and "
                                "SIGKILL when stopping a part.")
    ray: RaySection | None = Field(default=None, description="Run on a Ray cluster (also "
                                   "`--ray ADDRESS`); each section's placement picks its node.")

    @model_validator(mode="after")
    def _check(self) -> LaunchConfig:
        names = [e.name for e in self.envs]
        if len(set(names)) != len(names):
            raise ValueError(f"env names must be unique, got {names}; rename the duplicates")
        parts = [*names, *(n for i in self.inference for n in i.names), "api", "trainer"]
        clashes = sorted({p for p in parts if parts.count(p) > 1})
        if clashes:
            raise ValueError(f"part names must be unique (envs, inference nodes, api, trainer): "
                             f"{clashes} is used twice; rename it")
        if self.inference:
            if self.trainer.get("vllm_url"):
                raise ValueError("trainer.vllm_url and inference: both name the inference servers; "
                                 "keep one (inference: starts them, vllm_url uses running ones)")
            for env in self.envs:
                if "config" in env.args:
                    raise ValueError(f"envs.{env.name}.args.config: with inference: nodes the "
                                     "launcher gives each env a --config with the nodes' list; "
                                     "move its settings into args")
        if self.eval_env is not None and self.eval_env not in names:
            raise ValueError(f"eval_env {self.eval_env!r} is not one of the envs {names}")
        for key in FILLED_TRAINER_KEYS:
            if key in self.trainer:
                raise ValueError(f"trainer.{key} is set by atropos-launch; remove it from the "
                                 "config (use api.port / run_dir instead)")
        nproc = self.trainer.get("nproc_per_node", 1)
        if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
            raise ValueError(f"trainer.nproc_per_node must be a whole number >= 1 (training "
                             f"processes on this node), got {nproc!r}")
        nnodes = self.trainer.get("nnodes", 1)
        if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
            raise ValueError(f"trainer.nnodes must be a whole number >= 1 (nodes the trainer's "
                             f"ranks spread over, under --ray), got {nnodes!r}")
        try:
            self.trainer_placement  # noqa: B018 - validates it
        except ValidationError as exc:
            raise ValueError("trainer.placement: " + "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors())) from None
        return self

    @property
    def trainer_placement(self) -> Placement:
        """Where each trainer node runs under ``--ray`` (``trainer.placement``).

        Raises:
            ValidationError: ``trainer.placement`` is not a valid :class:`Placement`.
        """
        return Placement.model_validate(self.trainer.get("placement") or {})

    @property
    def trainer_settings(self) -> dict[str, Any]:
        """The ``trainer:`` section without the keys atropos-launch reads itself."""
        return {k: v for k, v in self.trainer.items() if k not in LAUNCHER_TRAINER_KEYS}


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each ``KEY=VALUE`` of ``overrides`` in the raw YAML mapping ``data`` (in place).

    ``KEY`` is the dotted path of a key as the YAML nests it: a section's field
    (``api.port``, ``ray.address``), an entry of ``envs:`` or ``inference:`` by its name
    (``envs.arithmetic.server_type``), and a key of a free-form mapping (``trainer:``, an env's
    ``args:``, ``eval_args:``) whole, dots included (``envs.arithmetic.args.env.group_size``,
    ``trainer.max_train_seconds``); ``trainer.placement.num_cpus`` reaches the trainer's
    placement. ``VALUE`` is read as a YAML value (``170`` an int, ``true`` a bool, ``null``
    or nothing None, ``[a, b]`` a list). Nothing is validated here: the result goes through the
    same validation as the file, so a typo gets the same did-you-mean.

    Args:
        data: the YAML file's top-level mapping.
        overrides: ``KEY=VALUE`` strings, applied in order.

    Returns:
        ``data``.

    Raises:
        ConfigError: an override without ``=``, a value that is not YAML, or an ``envs`` /
            ``inference`` name that no entry has (with the names there are).
    """
    import yaml

    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item}: expected KEY=VALUE, e.g. --set "
                              "trainer.max_train_seconds=170")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(f"--set {item}: the value is not valid YAML ({problem}); quote it "
                              "as a YAML string, e.g. KEY='\"...\"'") from exc
        _set_path(data, key.split("."), value, LaunchConfig, item)
    return data


def _set_path(node: dict[str, Any], parts: list[str], value: Any, model: type[BaseModel] | None,
              item: str) -> None:
    """Set ``parts`` (a split key) to ``value`` under ``node``, whose keys ``model`` describes."""
    import types
    import typing

    key, rest = parts[0], parts[1:]
    if not rest:
        node[key] = value
        return
    field = model.model_fields.get(key) if model is not None else None
    annotation = field.annotation if field is not None else None
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # X | None
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is list:
        (entry_model,) = typing.get_args(annotation)
        entries = node.get(key)
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"--set {item}: the config has no {key} entries to change")
        default = entry_model.model_fields["name"].default
        names = [str(e.get("name", default)) if isinstance(e, dict) else "?" for e in entries]
        if rest[0] not in names:
            close = _closest(rest[0], names)
            raise ConfigError(f"--set {item}: no {key} entry is named {rest[0]!r}"
                              + (f"; did you mean {' or '.join(close)}?" if close else "")
                              + f" (the names: {', '.join(names)})")
        if len(rest) == 1:
            raise ConfigError(f"--set {item}: name a key of that entry, e.g. "
                              f"{key}.{rest[0]}.args.KEY=VALUE")
        _set_path(entries[names.index(rest[0])], rest[1:], value, entry_model, item)
        return
    child = node.get(key)
    if not isinstance(child, dict):
        child = node[key] = {}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        _set_path(child, rest, value, annotation, item)
    elif annotation is not None and (annotation is dict or typing.get_origin(annotation) is dict):
        # a free-form mapping: its keys may hold dots (flags such as env.group_size)
        if model is LaunchConfig and key == "trainer" and rest[0] == "placement" and len(rest) > 1:
            placement = child.get("placement")
            if not isinstance(placement, dict):
                placement = child["placement"] = {}
            _set_path(placement, rest[1:], value, Placement, item)
        else:
            child[".".join(rest)] = value
    else:  # an unknown key (or a value that is no mapping): validation names it
        _set_path(child, rest, value, None, item)


def load_config(path: str | Path, overrides: list[str] | None = None) -> LaunchConfig:
    """Read and validate a launch YAML file, with command-line ``overrides`` applied first.

    The ``trainer:`` section is checked against the settings model of the trainer that
    ``trainer_name`` names (see :mod:`atroposlib.launch.trainers`).

    Args:
        path: the YAML file.
        overrides: ``KEY=VALUE`` strings (``atropos-launch --set``), see :func:`apply_overrides`.

    Raises:
        ConfigError: the file is missing, not YAML, names no registered trainer, an override
            is malformed, or validation fails (message lists every problem with its key path).
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist; see configs/quickstart-cpu.yaml")
    data = apply_overrides(load_yaml(path), overrides or [])
    source = f"{path} with --set {' '.join(overrides)}" if overrides else str(path)
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
               if k not in (*LAUNCHER_TRAINER_KEYS, *FILLED_TRAINER_KEYS)}
    trainer_config = None
    if trainer_config_model is not None:
        try:
            trainer_config = trainer_config_model.model_validate(
                {**trainer, "api_url": "http://x", "run_dir": "x"})
        except ValidationError as exc:
            problems += _validation_problems(exc, "trainer.", trainer_config_model)
    if config is None:
        raise ConfigError(f"{source}: invalid launch config:\n  " + "\n  ".join(problems))
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
        raise ConfigError(f"{source}: invalid launch config:\n  " + "\n  ".join(problems))
    if trainer_config is not None:
        # YAML reads an unquoted no/yes/off/on as a bool; where the trainer's model took it as a
        # word (``mixed_precision: no``), the trainer gets the word, not ``--no-<flag>``
        validated = trainer_config.model_dump(mode="json")
        config.trainer.update({k: validated[k] for k, v in trainer.items()
                               if isinstance(v, bool) and not isinstance(validated.get(k, v), bool)})
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
    sections = {"api": ApiSection, "envs": EnvSection, "ray": RaySection,
                "inference": InferenceSection}
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        where = prefix + ".".join(loc) if loc else prefix.rstrip(".") or "<root>"
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            owner = model
            if not prefix and loc and loc[0] in sections:
                owner = sections[loc[0]]
            if "placement" in loc[:-1]:
                owner = Placement
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
    """Parse one env's ``args`` with its script's own command line, as ``serve`` will.

    Runs ``python SCRIPT config --json ARGS`` (the env's public ``config`` subcommand, which
    layers ``config_init`` < ``--config`` YAML < flags exactly as ``serve`` does and prints the
    result), so the launcher reads the env's settings from that one parse, never from the raw
    ``args`` (which may leave a setting to the env's defaults). A script that cannot run, takes
    longer than ``timeout`` seconds, or prints no settings is not checked here (its own start-up
    still reports its problems): the check is empty.
    """
    import json

    try:
        child = subprocess.run([sys.executable, env.script, "config", "--json", *flags(env.args)],
                               capture_output=True, text=True, timeout=timeout,
                               env={**OFFLINE_ENV, **os.environ})
    except subprocess.TimeoutExpired:
        return EnvArgCheck()
    if child.returncode == 2:
        return EnvArgCheck(_flag_problems(child.stderr, env))
    out = child.stdout  # the JSON object, after anything the script itself printed first
    try:
        found = json.loads(out[0 if out.startswith("{") else out.rfind("\n{\n") + 1:]) \
            if child.returncode == 0 else {}
    except ValueError:
        return EnvArgCheck()
    size = (found.get("env") or {}).get("group_size") if isinstance(found, dict) else None
    return EnvArgCheck([], size if isinstance(size, int) and not isinstance(size, bool) else None)


def env_arg_problems(env: EnvSection, timeout: float = 30.0) -> list[str]:
    """The problems of :func:`env_arg_check` (one line each, by full key path)."""
    return env_arg_check(env, timeout).problems


#: One line of the env command line's unknown-flag error (:func:`atroposlib.utils.flags.unknown_flag_message`).
_UNKNOWN_FLAG = re.compile(r"unknown flag --(?P<flag>\S+?)(?:; did you mean --(?P<close>\S+)\?|;.*)?$")


def _flag_problems(stderr: str, env: EnvSection) -> list[str]:
    """The env command line's error (exit code 2) as launcher problems, by full key path.

    ``PROG config: error: unknown flag --env.group_sise; did you mean --env.group_size?`` becomes
    ``envs.NAME.args.env.group_sise: unknown flag; did you mean envs.NAME.args.env.group_size?``;
    a value the env config refuses becomes ``envs.NAME.args: --env.group_size: ...``. The
    error ends at the first blank line (the usage follows it).
    """
    where = f"envs.{env.name}.args"
    text = stderr.split(": error: ", 1)[1] if ": error: " in stderr else stderr.strip()
    problems = []
    for line in text.split("\n\n", 1)[0].splitlines():
        line = line.strip()
        unknown = _UNKNOWN_FLAG.match(line)
        if unknown:
            close = unknown.group("close")
            problems.append(f"{where}.{unknown.group('flag')}: unknown flag" + (
                f"; did you mean {where}.{close}?" if close
                else f"; see `python {env.script} serve --help`"))
        elif line and not (line.startswith("invalid ") and line.endswith(":")):
            problems.append(f"{where}: {line}")
    return problems or [f"{where}: the env refused its flags (exit code 2); run `python "
                        f"{env.script} serve` with them to see why"]


def launch_preflight(config: LaunchConfig) -> None:
    """Check the trainer's model path, the envs' tokenizer paths and a fixed ``api.port``.

    Runs before anything starts. These are checks of the launching host, so on a Ray cluster
    (``config.ray`` set) there are none: each part checks its own paths and ports on its node
    when it starts, and a failure stops the run with the part's log.

    Raises:
        PreflightError: one line per problem, each with its fix.
    """
    from atroposlib.utils import preflight as pf

    if config.ray is not None:
        return

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
