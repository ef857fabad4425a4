"""The command lines ``atropos-launch`` starts: flag rendering, the trainer's argv, free ports."""

from __future__ import annotations

import socket
import sys
from typing import Any


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
