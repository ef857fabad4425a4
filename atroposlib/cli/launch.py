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
    Placement,
    RaySection,
    apply_overrides,
    env_arg_problems,
    launch_preflight,
    load_config,
)
from atroposlib.launch.describe import describe_config
from atroposlib.launch.orchestration import Launcher
from atroposlib.launch.supervision import LaunchError, Part

__all__ = ["ApiSection", "EnvSection", "LaunchConfig", "LaunchError", "Launcher", "Part", "Placement",
           "RaySection", "apply_overrides", "describe_config", "env_arg_problems",
           "flags", "free_port", "launch_preflight", "load_config", "main", "trainer_command", "trainer_flags"]


def main(argv: list[str] | None = None) -> int:
    """Console script ``atropos-launch CONFIG.yaml [--set KEY=VALUE ...] [--run-dir DIR] [--ray [ADDRESS]]``.

    Returns:
        The run's exit code (:meth:`Launcher.run`), or 2 for a bad config, override or run
        directory (one message on stderr).
    """
    from atroposlib.utils.flags import ArgumentParser

    parser = ArgumentParser(
        prog="atropos-launch",
        description="Run run-api, the GRPO trainer (with its vLLM) and the environments from one "
        "YAML file, on this host or (--ray) as Ray actors on a Ray cluster; logs go to "
        "<run_dir>/logs/<name>.log and the console.")
    parser.add_argument("config", help="launch YAML, e.g. configs/quickstart-cpu.yaml")
    parser.add_argument("--run-dir", default=None, metavar="DIR",
                        help="run directory instead of run_dir from the config; it must hold no "
                        "run yet (default: a new runs/<UTC timestamp>[-N])")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="override one config key, e.g. --set trainer.max_train_seconds=170 "
                        "--set envs.arithmetic.args.env.group_size=4 (envs by name; the value is "
                        "read as YAML); validated like the file. Repeatable")
    parser.add_argument("--ray", nargs="?", const="auto", default=None, metavar="ADDRESS",
                        help="run every part as a Ray actor on the Ray cluster at ADDRESS "
                        "(HOST:PORT of its head, ray://HOST:10001, or 'auto', the default: the "
                        "cluster this host is part of); overrides ray.address in the config. "
                        "Needs pip install 'atroposlib[ray]'")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
        if args.ray is not None:
            config.ray = (config.ray or RaySection()).model_copy(update={"address": args.ray})
        if config.ray is None and config.trainer.get("nnodes", 1) > 1:
            raise ConfigError(f"trainer.nnodes: {config.trainer['nnodes']} spreads the trainer "
                              "over several nodes, which needs a Ray cluster: pass --ray ADDRESS "
                              "(or set ray: in the config), or start torchrun on each node by "
                              "hand (docs/tutorials/train-on-a-cluster.md)")
        launch_preflight(config)
        if args.run_dir:
            config.run_dir = args.run_dir
        launcher = Launcher(config)
    except ConfigError as exc:
        print(f"atropos-launch: {exc}", file=sys.stderr)
        return 2
    launcher.say(f"config {args.config}" + "".join(f" --set {o}" for o in args.overrides)
                 + f"; run directory {launcher.run_dir}")
    for line in describe_config(config):
        launcher.say("  " + line)
    return launcher.run()


if __name__ == "__main__":
    raise SystemExit(main())
