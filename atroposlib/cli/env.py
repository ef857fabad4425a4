"""``atropos-env``: list the installed environments and run one by name.

``atropos-env list`` prints each registered name, its ``module:Class`` and the first line of
the class docstring (read from source; nothing is imported unless ``--check`` is given).
``atropos-env NAME serve|process|evaluate [flags]`` runs the environment registered as NAME
with exactly the flags of ``python path/to/env.py serve|process|evaluate [flags]``: the rest
of the command line goes to the env's own command line unchanged.

Environments are registered with the ``atroposlib.environments`` entry-point group (see
:mod:`atroposlib.env_runtime.entry_points`).
"""

from __future__ import annotations

import argparse
import sys

from atroposlib.utils.flags import ArgumentParser

_EPILOG = """\
examples:
  atropos-env list
  atropos-env gsm8k serve --openai.base_url http://127.0.0.1:9001/v1
  atropos-env gsm8k process --env.total_steps 4 --env.group_size 8
  atropos-env gsm8k evaluate --env.data_dir_to_save_evals evals/gsm8k
  atropos-env gsm8k serve --help      (every flag of that environment)

Environments of other ecosystems, by prefix (see docs/guides/ecosystems.md):
  atropos-env verifiers:reverse-text serve          (a verifiers taskset or environment)
  atropos-env verifiers:my_pkg.tasks:MyTaskset process
  atropos-env openenv:my_env.server.app:app serve   (an OpenEnv server app)
  atropos-env gym:Blackjack-v1 serve                (a Gymnasium env with text observations)

Register your own environment in your package's pyproject.toml:
  [project.entry-points."atroposlib.environments"]
  my_env = "my_package.my_module:MyEnv"
"""


def build_parser() -> ArgumentParser:
    """The top-level parser: ``NAME`` (or ``list``) then everything else, passed through."""
    parser = ArgumentParser(
        prog="atropos-env",
        description="Run an installed environment by name, or list them.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "name", metavar="NAME",
        help="a registered environment name, `list` (reserved), or verifiers:SPEC, "
        "openenv:SPEC, gym:ID for environments of those ecosystems",
    )
    parser.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        metavar="MODE [FLAGS]",
        help="serve|process|evaluate|config and the environment's own flags",
    )
    return parser


def _list_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="atropos-env list",
        description="List the environments registered by installed packages.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="import each environment (slower): report the ones that fail to load and show "
        "the docstring of the loaded class",
    )
    return parser


def _list(argv: list[str]) -> int:
    from atroposlib.env_runtime.entry_points import (
        first_line,
        load_env,
        registered_envs,
        static_description,
    )
    from atroposlib.errors import ConfigError

    args = _list_parser().parse_args(argv)
    envs = registered_envs()
    if not envs:
        print("no environments registered (entry-point group 'atroposlib.environments')")
        return 0
    rows: list[tuple[str, str, str]] = []
    failed = 0
    for name, entry in envs.items():
        if args.check:
            try:
                description = first_line(load_env(name).__doc__)
            except ConfigError as exc:
                description = f"FAILED: {exc}"
                failed += 1
        else:
            description = static_description(entry)
        rows.append((name, entry.target, description))
    width_name = max(len(r[0]) for r in rows)
    width_target = max(len(r[1]) for r in rows)
    for name, target, description in rows:
        print(f"{name:<{width_name}}  {target:<{width_target}}  {description}".rstrip())
    _print_adapter_prefixes()
    return 1 if failed else 0


def _print_adapter_prefixes() -> None:
    """Print the ecosystem prefixes ``atropos-env PREFIX:SPEC`` accepts, one example each."""
    from atroposlib.adapters import ADAPTER_HELP

    print("\nenvironments of other ecosystems, by prefix (atropos-env PREFIX:SPEC MODE [FLAGS]):")
    width_form = max(len(form) for form, _, _ in ADAPTER_HELP.values())
    width_example = max(len(example) for _, example, _ in ADAPTER_HELP.values())
    for form, example, description in ADAPTER_HELP.values():
        print(f"{form:<{width_form}}  {example:<{width_example}}  {description}")


def main(argv: list[str] | None = None) -> None:
    """Console entry point of ``atropos-env``.

    Raises:
        SystemExit: 0 on success; 2 for an unknown name or bad flags (with did-you-mean
            hints); whatever the environment's command line exits with otherwise.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.name == "list":
        raise SystemExit(_list(args.rest))

    from atroposlib.adapters import adapter_env_class, is_adapter_name
    from atroposlib.env_runtime.entry_points import load_env
    from atroposlib.errors import ConfigError

    try:
        env_cls = adapter_env_class(args.name) if is_adapter_name(args.name) else load_env(args.name)
    except ConfigError as exc:
        parser.error(str(exc))
    if not args.rest:
        parser.error(f"{args.name}: give a mode: serve, process or evaluate (then its flags), or config to print its settings")
    from atroposlib.env_runtime.command_line import run_cli

    # The env command line names itself after argv[0] in usage and errors.
    saved, sys.argv = sys.argv, [f"atropos-env {args.name}", *args.rest]
    try:
        run_cli(env_cls, list(args.rest))
    finally:
        sys.argv = saved


if __name__ == "__main__":
    main()
