"""``atropos-launch CONFIG.yaml``: run-api, the GRPO trainer (which owns vLLM) and the envs, as one command.

The work lives in :mod:`atroposlib.launch`: :mod:`~atroposlib.launch.config` (the YAML schema),
:mod:`~atroposlib.launch.supervision` (starting, watching and stopping parts) and
:mod:`~atroposlib.launch.orchestration` (the order of a run).
"""

from __future__ import annotations

import sys

from atroposlib.errors import ConfigError
from atroposlib.launch.commands import flags, free_port, trainer_command, trainer_flags
from atroposlib.launch.config import (
    ApiSection,
    EnvSection,
    LaunchConfig,
    env_arg_problems,
    launch_preflight,
    load_config,
)
from atroposlib.launch.orchestration import Launcher
from atroposlib.launch.supervision import LaunchError, Part

__all__ = ["ApiSection", "EnvSection", "LaunchConfig", "LaunchError", "Launcher", "Part", "env_arg_problems",
           "flags", "free_port", "launch_preflight", "load_config", "main", "trainer_command", "trainer_flags"]


def main(argv: list[str] | None = None) -> int:
    """Console script ``atropos-launch CONFIG.yaml [--run-dir DIR]``."""
    from atroposlib.utils.flags import ArgumentParser

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
