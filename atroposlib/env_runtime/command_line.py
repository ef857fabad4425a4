"""The env command line: ``python my_env.py serve|process|evaluate`` with layered configuration.

Layering, lowest to highest:

1. ``config_init()`` of the env class (then mode defaults: ``process`` sets
   ``include_messages=True``, ``ensure_scores_are_not_same=False``, ``use_wandb=False`` and
   ``data_path_to_save_groups=data/<name>.jsonl`` when unset; ``evaluate`` sets
   ``use_wandb=False``; ``serve`` defaults ``wandb_name`` to the env's ``name``);
2. ``--config FILE.yaml`` with top-level keys ``env:``, ``openai:`` (a mapping, or a list for
   several servers), ``slurm:``, ``testing:`` (and ``max_n_completions:``, ``proxy_url:``);
3. flags: ``--env.<field>``, ``--openai.<field>``, ``--slurm``, ``--testing``,
   ``--wait_for_services`` ... (one style: a config field's own name, after its namespace).

The command line is parsed once (:func:`parse_command`): ``config_init()`` runs once, the YAML
file is read once, and argparse reads the flags once before the config models validate them.

A single server config always stays a list of one ``APIServerConfig`` with the given URL.

Extra server namespaces: an env class may declare ``server_namespaces = {"teacher":
"teacher_server_configs"}``; then ``serve`` and ``process`` also take ``--teacher.<field>`` flags
(``APIServerConfig`` fields) and a YAML ``teacher:`` key (mapping or list), resolved like
``openai`` and passed to the env constructor as ``teacher_server_configs=[...]``. Defaults for a
namespace come from the class method ``<prefix>_config_init()`` when the class has one and it
returns servers (Atropos 0.4's ``teacher_config_init``), under YAML and flags as
``config_init``'s are for ``openai``. A namespace given nowhere is not passed (the constructor
default applies). ``evaluate`` has no such flags: it sends no groups.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import difflib
import logging
import signal
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from atroposlib.envs.config import BaseEnvConfig, UnknownConfigFieldWarning
from atroposlib.envs.constants import ENV_NAMESPACE, OPENAI_NAMESPACE
from atroposlib.errors import ConfigError, RolloutError
from atroposlib.inference.clients.base import InferenceClient
from atroposlib.inference.clients.config import APIServerConfig, ServerBaseline
from atroposlib.inference.clients.manager import ServerManagerConfig
from atroposlib.inference.clients.resolve import resolve_server_configs, validated
from atroposlib.utils.flags import (
    ArgumentParser,
    add_config_flags,
    collect_overrides,
    merge_sections,
    settings_parser,
    unknown_flag_message,
)
from atroposlib.utils.yaml_file import load_yaml

if TYPE_CHECKING:
    from atroposlib.envs.base import BaseEnv

logger = logging.getLogger(__name__)

MODES = ("serve", "process", "evaluate")
#: The docs page of this command line, named in its ``--help``.
ENV_CLI_DOCS = "docs/guides/environments.md"
#: What ``config_init()`` returns: ``(env_config, server_configs)``.
InitDefaults = tuple[BaseEnvConfig, Any]
_YAML_KEYS = (ENV_NAMESPACE, OPENAI_NAMESPACE, "slurm", "testing", "max_n_completions", "proxy_url")
#: Modes that get the env's extra server namespaces (``server_namespaces``): the group producers.
NAMESPACE_MODES = ("serve", "process")
_MODE_HELP = {
    "serve": "Register with the trajectory API and keep it supplied with scored groups.",
    "process": "Generate groups offline (no API) into a JSONL file plus an HTML viewer.",
    "evaluate": "Run evaluate() once and write metrics.json.",
    "config": "Print the settings that --mode (serve unless given) would run with, layered as it layers "
    "them, then exit (YAML; JSON with --json). Starts nothing.",
}


class RunnerOptions(BaseModel):
    """How the runner starts; CLI flags are unprefixed (``--wait_for_services false``)."""

    model_config = ConfigDict(extra="forbid")

    wait_for_services: bool | None = Field(
        default=None,
        description="Wait (logging what for) for an unreachable run-api or inference server "
        "instead of failing at once with the fix; null: wait in serve mode, fail at once in "
        "process and evaluate.",
    )


@dataclass(frozen=True)
class EnvCommand:
    """An env command line, parsed once: the mode and every setting, layered and validated.

    Attributes:
        mode: ``serve``, ``process`` or ``evaluate``.
        env_config: the env's config (``config_init`` < YAML ``env:`` < ``--env.*``).
        servers: the inference server configs (``openai``).
        manager: the server manager's settings (``--slurm``, ``--testing`` ...).
        extra_servers: the env's extra server namespaces as constructor keywords, e.g.
            ``{"teacher_server_configs": [APIServerConfig(...)]}``.
        wait_for_services: wait for unreachable services instead of failing at once.
        show: ``yaml`` or ``json`` for the ``config`` subcommand (print the settings, run
            nothing); None to run ``mode``.
    """

    mode: str
    env_config: BaseEnvConfig
    servers: list[APIServerConfig | InferenceClient] | ServerBaseline
    manager: ServerManagerConfig
    extra_servers: dict[str, list[APIServerConfig | InferenceClient]] = field(default_factory=dict)
    wait_for_services: bool = False
    show: str | None = None


def mode_env_defaults(env_cls: type[BaseEnv], mode: str, base: dict[str, Any]) -> dict[str, Any]:
    """Return the env-config overrides a mode applies on top of ``config_init`` values."""
    if mode == "process":
        out: dict[str, Any] = {
            "include_messages": True,
            "ensure_scores_are_not_same": False,
            "use_wandb": False,
        }
        if not base.get("data_path_to_save_groups"):
            out["data_path_to_save_groups"] = f"data/{env_cls.name or 'groups'}.jsonl"
        return out
    if mode == "evaluate":
        return {"use_wandb": False}
    if mode == "serve" and not base.get("wandb_name") and env_cls.name:
        return {"wandb_name": env_cls.name}
    return {}


def _server_namespaces(env_cls: type[BaseEnv]) -> dict[str, str]:
    """The env's extra server namespaces: CLI/YAML prefix -> constructor keyword."""
    return dict(getattr(env_cls, "server_namespaces", None) or {})


def _load_yaml(path: str, extra_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    allowed = (*_YAML_KEYS, *extra_keys)
    data = load_yaml(path, "--config")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ConfigError(
            f"--config {path}: unknown top-level key(s) {unknown}; allowed: {', '.join(allowed)}"
        )
    if data.get("env") is not None and not isinstance(data["env"], dict):
        raise ConfigError(f"--config {path}: `env:` must be a mapping of BaseEnvConfig fields")
    for key in ("openai", *extra_keys):
        value = data.get(key)
        if value is not None and not isinstance(value, (dict, list)):
            raise ConfigError(f"--config {path}: `{key}:` must be a mapping or a list of mappings")
    return data


def _env_config_class(env_cls: type[BaseEnv], init_env: BaseEnvConfig) -> type[BaseEnvConfig]:
    """The config class whose fields become ``--env.*``: ``config_init``'s when more specific."""
    declared = env_cls.env_config_cls
    return type(init_env) if isinstance(init_env, declared) else declared


def _reject_typed_unknown_fields(
    config_cls: type[BaseEnvConfig],
    yaml_env: dict[str, Any],
    code_extras: dict[str, Any],
    config_path: str | None,
) -> None:
    """Reject YAML ``env:`` keys the config class does not declare, suggesting the closest.

    Env configs accept undeclared keyword fields from Python code (with a warning), but a key
    a person typed into YAML is most likely a typo. Keys that ``config_init`` itself set
    (``code_extras``) are allowed, so YAML can override them. ``--env.*`` flags need no check
    here: argparse already rejects unknown ones with a suggestion.

    Raises:
        ConfigError: naming each unknown key and its closest declared field.
    """
    known = set(config_cls.model_fields) | set(code_extras) | set(config_cls.legacy_keys)
    unknown = sorted(set(yaml_env) - known)
    if not unknown:
        return
    lines = [f"invalid env configuration in --config {config_path}:"]
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
        hint = (
            f"did you mean {' or '.join(f'--env.{c}' for c in close)}?"
            if close
            else "check the spelling; see --help"
        )
        lines.append(f"  --env.{key}: unknown field; {hint}")
    raise ConfigError("\n".join(lines))


def _yaml_data(env_cls: type[BaseEnv], namespace: argparse.Namespace) -> dict[str, Any]:
    """The ``--config`` file's mapping (``{}`` without one), read once per command line."""
    path = getattr(namespace, "config", None)
    return _load_yaml(path, tuple(_server_namespaces(env_cls))) if path else {}


def build_command(
    env_cls: type[BaseEnv],
    mode: str,
    namespace: argparse.Namespace,
    defaults: InitDefaults | None = None,
) -> EnvCommand:
    """Apply the layering (module docstring) to parsed arguments: every setting, once.

    Args:
        env_cls: the env class.
        mode: ``serve``, ``process`` or ``evaluate``.
        namespace: what :func:`build_parser`'s parser made of the command line.
        defaults: ``env_cls.config_init()`` when the caller has it already (it is called
            otherwise).

    Raises:
        ConfigError: bad YAML, unknown keys or invalid values (the message names the flag).
    """
    init_env, init_servers = defaults if defaults is not None else env_cls.config_init()
    data = _yaml_data(env_cls, namespace)
    overrides = collect_overrides(namespace, [ENV_NAMESPACE, OPENAI_NAMESPACE, "", *_server_namespaces(env_cls)])
    base_env = init_env.model_dump()
    env_values = {**base_env, **mode_env_defaults(env_cls, mode, base_env)}
    env_cls_config = _env_config_class(env_cls, init_env)
    # a nested section (item_filter) is merged field by field, layer over layer
    env_values = merge_sections(env_values, data.get(ENV_NAMESPACE) or {}, env_cls_config)
    env_values = merge_sections(env_values, overrides[ENV_NAMESPACE], env_cls_config)
    _reject_typed_unknown_fields(
        env_cls_config, data.get(ENV_NAMESPACE) or {}, init_env.model_extra or {}, namespace.config
    )
    with warnings.catch_warnings():
        # Undeclared fields set by config_init's code were already warned about there.
        warnings.simplefilter("ignore", UnknownConfigFieldWarning)
        env_config = validated(env_cls_config, env_values, ENV_NAMESPACE, "env configuration")
    servers = resolve_server_configs(init_servers, data.get(OPENAI_NAMESPACE), overrides[OPENAI_NAMESPACE])
    top = overrides[""]
    manager_values = {k: data[k] for k in ("slurm", "testing", "max_n_completions", "proxy_url") if k in data}
    manager_values.update({k: v for k, v in top.items() if k in ServerManagerConfig.model_fields})
    manager = validated(ServerManagerConfig, manager_values, None, "server manager configuration")
    runner = validated(RunnerOptions, {k: v for k, v in top.items() if k in RunnerOptions.model_fields},
                       None, "runner options")
    wait = runner.wait_for_services
    return EnvCommand(
        mode=mode,
        env_config=env_config,
        servers=servers,
        manager=manager,
        extra_servers=_namespace_servers(env_cls, mode, data, overrides),
        wait_for_services=mode == "serve" if wait is None else wait,
    )


def _namespace_servers(
    env_cls: type[BaseEnv], mode: str, data: dict[str, Any], overrides: dict[str, dict[str, Any]]
) -> dict[str, list[APIServerConfig | InferenceClient]]:
    """Resolve the env's extra server namespaces (e.g. ``teacher``) into constructor kwargs.

    Each namespace merges ``<prefix>_config_init()`` (when the class defines it and it returns
    servers; else ``APIServerConfig`` defaults) < YAML ``<prefix>:`` < ``--<prefix>.*`` flags,
    exactly like ``openai``. Only ``serve`` and ``process`` use them; a namespace with no
    defaults, YAML or flags is left out.
    """
    if mode not in NAMESPACE_MODES:
        return {}
    kwargs: dict[str, list[APIServerConfig | InferenceClient]] = {}
    for prefix, keyword in _server_namespaces(env_cls).items():
        hook = getattr(env_cls, f"{prefix}_config_init", None)
        defaults = hook() if callable(hook) else None
        if defaults is None and not data.get(prefix) and not overrides.get(prefix):
            continue
        resolved = resolve_server_configs(ServerBaseline() if defaults is None else defaults,
                                          data.get(prefix), overrides.get(prefix, {}), prefix)
        kwargs[keyword] = list(resolved) if isinstance(resolved, list) else [resolved]
    return kwargs


def build_configs(
    env_cls: type[BaseEnv], mode: str, namespace: argparse.Namespace
) -> tuple[BaseEnvConfig, list[APIServerConfig | InferenceClient] | ServerBaseline, ServerManagerConfig]:
    """``(env_config, server_configs, manager_config)`` of :func:`build_command`.

    Raises:
        ConfigError: bad YAML, unknown keys or invalid values (the message names the flag).
    """
    command = build_command(env_cls, mode, namespace)
    return command.env_config, command.servers, command.manager


def build_namespace_servers(
    env_cls: type[BaseEnv], mode: str, namespace: argparse.Namespace
) -> dict[str, list[APIServerConfig | InferenceClient]]:
    """The env's extra server namespaces (e.g. ``teacher``) as constructor kwargs.

    Each namespace merges ``<prefix>_config_init()`` (when the class defines it and it returns
    servers; else ``APIServerConfig`` defaults) < YAML ``<prefix>:`` < ``--<prefix>.*`` flags,
    exactly like ``openai``. Only ``serve`` and ``process`` use them.

    Returns:
        ``{constructor_keyword: [config, ...]}`` for every namespace with defaults, YAML or flags.

    Raises:
        ConfigError: invalid values (the message names the ``--<prefix>.*`` flag).
    """
    overrides = collect_overrides(namespace, list(_server_namespaces(env_cls)))
    return _namespace_servers(env_cls, mode, _yaml_data(env_cls, namespace), overrides)


def build_parser(env_cls: type[BaseEnv], defaults: InitDefaults | None = None) -> argparse.ArgumentParser:
    """Build the ``serve|process|evaluate`` parser; every option shows its description/default.

    Args:
        env_cls: the env class.
        defaults: ``env_cls.config_init()`` when the caller has it already (it is called
            otherwise).
    """
    init_env, init_servers = defaults if defaults is not None else env_cls.config_init()
    base_env = init_env.model_dump()
    server_defaults: dict[str, Any] = {}
    first = init_servers[0] if isinstance(init_servers, (list, tuple)) and init_servers else init_servers
    if isinstance(first, ServerBaseline):
        server_defaults = first.model_dump()
    parser = ArgumentParser(
        prog=Path(sys.argv[0]).name if sys.argv and sys.argv[0] else env_cls.__name__,
        description=f"{env_cls.__name__} ({env_cls.name or 'unnamed env'}): "
        "serve | process | evaluate | config. Layering: config_init < --config YAML < flags.",
        epilog=f"Guide: {ENV_CLI_DOCS}.",
    )
    sub = parser.add_subparsers(dest="mode", metavar="{serve,process,evaluate,config}", required=True)
    parser.mode_parsers = {}  # type: ignore[attr-defined]
    for command in (*MODES, "config"):
        mode_parser = sub.add_parser(command, help=_MODE_HELP[command], description=_MODE_HELP[command]
                                     + " Every flag also takes dashes (--env.group-size).",
                                     epilog=f"Guide: {ENV_CLI_DOCS}.")
        mode = "serve" if command == "config" else command  # the flags config shows are serve's
        if command == "config":
            mode_parser.add_argument("--mode", dest="config_mode", choices=MODES, default="serve",
                                     help="The mode whose settings to print.")
            add_config_flags(mode_parser)
        parser.mode_parsers[command] = mode_parser  # type: ignore[attr-defined]
        mode_parser.add_argument(
            "--config",
            default=None,
            metavar="YAML",
            help="YAML with keys env:, openai: (mapping or list), slurm:, testing:.",
        )
        # earlier spellings of --wait_for_services, still accepted
        for old, value in (("--wait-for-services", "true"), ("--no-wait-for-services", "false")):
            mode_parser.add_argument(old, dest="wait_for_services", action="store_const", const=value,
                                     default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        env_defaults = {**base_env, **mode_env_defaults(env_cls, mode, base_env)}
        for model, prefix, shown, title in (
            (_env_config_class(env_cls, init_env), ENV_NAMESPACE, env_defaults, "env options"),
            (APIServerConfig, OPENAI_NAMESPACE, server_defaults, "inference server (--openai.*)"),
            (ServerManagerConfig, "", None, "server manager"),
            (RunnerOptions, "", {"wait_for_services": mode == "serve"}, "runner"),
            *((APIServerConfig, prefix, None, f"{prefix} inference server (--{prefix}.*, passed as "
               f"{keyword})") for prefix, keyword in _server_namespaces(env_cls).items()
              if mode in NAMESPACE_MODES),
        ):
            settings_parser(model, prefix, parser=mode_parser, defaults=shown, title=title)
    return parser


def parse_command(env_cls: type[BaseEnv], argv: list[str] | None = None) -> EnvCommand:
    """Parse ``argv`` (``sys.argv[1:]`` when None) once: the mode and every setting.

    ``config_init()`` runs once, the ``--config`` file is read once, and each flag is parsed
    once, by argparse, then validated by the config models.

    Raises:
        SystemExit: code 2 on unknown flags or invalid values (message on stderr).
    """
    defaults = env_cls.config_init()
    parser = build_parser(env_cls, defaults)
    namespace, unknown = parser.parse_known_args(argv)
    mode_parser = parser.mode_parsers[namespace.mode]  # type: ignore[attr-defined]
    if unknown:
        mode_parser.error(unknown_flag_message(unknown, mode_parser))
    show = ("json" if namespace.json else "yaml") if namespace.mode == "config" else None
    try:
        command = build_command(env_cls, namespace.config_mode if show else namespace.mode,
                                namespace, defaults)
    except ConfigError as exc:
        mode_parser.error(str(exc))
    return dataclasses.replace(command, show=show) if show else command


def parse_args(
    env_cls: type[BaseEnv], argv: list[str] | None = None
) -> tuple[str, BaseEnvConfig, list[APIServerConfig | InferenceClient] | ServerBaseline, ServerManagerConfig]:
    """Parse ``argv`` into ``(mode, env_config, server_configs, manager_config)``.

    Raises:
        SystemExit: code 2 on unknown flags or invalid values (message on stderr).
    """
    command = parse_command(env_cls, argv)
    return command.mode, command.env_config, command.servers, command.manager


def parse_args_with_namespaces(
    env_cls: type[BaseEnv], argv: list[str] | None = None
) -> tuple[
    str,
    BaseEnvConfig,
    list[APIServerConfig | InferenceClient] | ServerBaseline,
    ServerManagerConfig,
    dict[str, list[APIServerConfig | InferenceClient]],
]:
    """Like :func:`parse_args`, plus the extra server namespaces as constructor kwargs.

    Returns:
        ``(mode, env_config, server_configs, manager_config, extra_kwargs)``, where
        ``extra_kwargs`` is e.g. ``{"teacher_server_configs": [APIServerConfig(...)]}``.

    Raises:
        SystemExit: code 2 on unknown flags or invalid values (message on stderr).
    """
    command = parse_command(env_cls, argv)
    return command.mode, command.env_config, command.servers, command.manager, command.extra_servers


def _install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - non-Unix
            pass


async def _run_mode(env: BaseEnv, mode: str) -> Any:
    if mode != "serve":
        # SIGTERM cancels like Ctrl-C does, so process keeps its JSONL and writes the HTML.
        task = asyncio.current_task()
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - non-Unix
            pass
    if mode == "process":
        return await env.process_manager()
    if mode == "evaluate":
        path = await env._evaluate_and_save()
        print(f"metrics written to {path}")
        return path
    stop = asyncio.Event()
    _install_signal_handlers(stop)
    from atroposlib.env_runtime.serve import SERVE_STOP_EVENT

    SERVE_STOP_EVENT.set(stop)  # the serve loop env_manager() starts stops on it
    return await env.env_manager()


def build_env(env_cls: type[BaseEnv], argv: list[str] | None = None) -> tuple[str, BaseEnv]:
    """Parse ``argv`` and construct the env the way ``run_cli`` runs it (nothing started yet).

    Returns:
        ``(mode, env)``: the chosen mode (``serve``/``process``/``evaluate``) and the env, with
        its server manager's ``max_n_completions`` and ``proxy_url`` taken from the command line
        or YAML file.

    Raises:
        SystemExit: bad flags (argparse's usage error, exit code 2).
        ConfigError: the env refuses its configuration (e.g. a teacher that cannot be used).
    """
    command = parse_command(env_cls, argv)
    return command.mode, env_from_command(env_cls, command)


def env_from_command(env_cls: type[BaseEnv], command: EnvCommand) -> BaseEnv:
    """Construct the env a parsed command line describes (nothing started yet).

    With ``ATROPOS_FAULTS`` set, a fraction of its rollouts fails on purpose
    (:func:`atroposlib.envs.faults.install_from_environ`).

    Raises:
        ConfigError: the env refuses its configuration (e.g. a teacher that cannot be used), or
            ``ATROPOS_FAULTS`` does not parse.
    """
    from atroposlib.envs.faults import install_from_environ

    manager = command.manager
    env = env_cls(command.env_config, command.servers, slurm=manager.slurm, testing=manager.testing,
                  **command.extra_servers)
    env.server.max_n_completions = manager.max_n_completions
    env.server.proxy_url = manager.proxy_url or env.server.proxy_url
    return install_from_environ(env)


def env_preflight(mode: str, env: BaseEnv, wait: bool = False) -> None:
    """Check, in seconds, what the mode needs before it starts: tokenizer, run-api, inference.

    ``serve`` needs run-api (``--env.rollout_server_url``); every mode needs the tokenizer
    (``--env.tokenizer_name``) and each configured inference server serving its model
    (skipped for servers without a ``base_url``, e.g. ``--testing``'s fake one).

    With ``wait`` an unreachable service is waited for instead of failing: ``serve`` logs what
    it waits for and starts (its loop already waits for run-api and rides out inference
    outages, and stops cleanly on SIGTERM meanwhile); ``process``/``evaluate`` wait here until
    the inference server answers. A missing path or an unserved model never waits.

    Raises:
        PreflightError: one line per problem, each with its fix.
    """
    from atroposlib.utils import preflight as pf

    problems = [pf.check_model_path(env.config.tokenizer_name, "--env.tokenizer_name", "tokenizer")]
    if mode == "serve":
        url = env.config.rollout_server_url
        down = pf.check_run_api(url, "--env.rollout_server_url")
        if down and wait:
            logger.warning("waiting for run-api at %s (start it with `run-api`)", url)
        else:
            problems.append(down)
    # --testing's in-process FakeServer has no base_url: nothing to probe
    for server in [s.config for s in env.server.servers
                   if getattr(getattr(s, "config", None), "base_url", None)]:
        def reachable(s: APIServerConfig = server) -> str | None:
            return pf.check_inference_server(s.base_url, None, "--openai.base_url",
                                             "--openai.model_name", s.api_key)

        waiting_for = f"inference server at {server.base_url} (start it, e.g. `python -m atroposlib.inference.vllm_process --port PORT`)"
        if wait and reachable():
            if mode == "serve":
                logger.warning("waiting for %s; rollouts start when it answers", waiting_for)
                continue
            pf.raise_on_problems(problems)  # a wrong path is never worth waiting for
            pf.wait_until_ok(reachable, waiting_for)
        problems.append(pf.check_inference_server(server.base_url, server.model_name,
                                                  "--openai.base_url", "--openai.model_name",
                                                  server.api_key))
    pf.raise_on_problems(problems)


def run_cli(env_cls: type[BaseEnv], argv: list[str] | None = None) -> None:
    """Entry point behind ``BaseEnv.cli()``: parse, build the env, run the chosen mode."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # One INFO line per request otherwise (recent openai releases send through the httpx2 fork).
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        command = parse_command(env_cls, argv)
        if command.show:  # the config subcommand: print the settings, start nothing
            from atroposlib.env_runtime.settings_report import print_settings

            return print_settings(command)
        mode, env = command.mode, env_from_command(env_cls, command)
        env_preflight(mode, env, wait=command.wait_for_services)
    except ConfigError as exc:  # e.g. a teacher that cannot be used; a failed pre-flight
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:  # while waiting for services
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    try:
        asyncio.run(_run_mode(env, mode))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except RolloutError as exc:  # e.g. process mode: every item failing in a row
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # process/evaluate: files written so far are kept
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except asyncio.CancelledError:  # SIGTERM during process/evaluate
        print("terminated", file=sys.stderr)
        raise SystemExit(143) from None


__all__ = [
    "EnvCommand",
    "RunnerOptions",
    "build_command",
    "build_configs",
    "build_env",
    "build_namespace_servers",
    "build_parser",
    "env_from_command",
    "parse_args",
    "parse_command",
    "parse_args_with_namespaces",
    "resolve_server_configs",
    "run_cli",
]
