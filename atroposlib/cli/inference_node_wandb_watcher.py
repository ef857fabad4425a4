"""Log the health of one node's inference servers to the run's W&B project (Atropos 0.4 script).

``python -m atroposlib.cli.inference_node_wandb_watcher --api_addr URL --tp N --node_num K``
waits until the trajectory API at ``URL`` knows the run's W&B project (``GET /wandb_info``),
joins it as run ``inf_node_K``, then every ``--interval-s`` seconds probes the node's
``gpus // tp`` inference servers (ports ``base_port``, ``base_port + 1``, ...) and, whenever the
API's step (``GET /status``) has advanced, logs ``server/server_health_K_I`` = 1.0 (answers 200)
or 0.0 at that step.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import httpx
from tenacity import retry, retry_if_result, wait_fixed

from atroposlib.utils.flags import ArgumentParser

#: GPUs per node assumed by Atropos 0.4's script; ``gpus // tp`` servers are probed.
DEFAULT_GPUS = 8
DEFAULT_BASE_PORT = 9000
DEFAULT_HEALTH_PATH = "/health"


def update_wandb(health_statuses: dict[str, float], step: int | None = None) -> None:
    """Log ``health_statuses`` to the current W&B run (at ``step`` when given)."""
    import wandb

    wandb.log(health_statuses, step=step)


@retry(wait=wait_fixed(1), retry=retry_if_result(lambda info: info is None))
def _wandb_info(client: httpx.Client) -> dict[str, Any] | None:
    """The API's ``/wandb_info`` once it names a project; None (tried again in 1 s) before."""
    try:
        info = client.get("/wandb_info").json()
    except httpx.TransportError:
        print("waiting for the API ...", file=sys.stderr, flush=True)
        return None
    return info if info.get("project") else None


def _health(client: httpx.Client, url: str) -> float:
    try:
        return 1.0 if client.get(url).status_code == 200 else 0.0
    except httpx.TransportError:
        return 0.0


def run(api_addr: str, tp: int, node_num: int, *, gpus: int = DEFAULT_GPUS,
        base_port: int = DEFAULT_BASE_PORT, health_path: str = DEFAULT_HEALTH_PATH,
        interval_s: float = 60.0, max_polls: int | None = None) -> None:
    """Watch the node's inference servers and log their health to W&B (see the module docstring).

    Args:
        api_addr: the trajectory API's base URL.
        tp: tensor-parallel size of each server (``gpus // tp`` servers are probed).
        node_num: this node's number, in the W&B run name and metric names.
        gpus: GPUs on the node.
        base_port: port of the first server; the others follow it.
        health_path: path probed on each server (200 = healthy).
        interval_s: seconds between probes.
        max_polls: stop after this many probes (None: run until interrupted).

    Raises:
        ValueError: ``tp`` < 1 or larger than ``gpus``.
    """
    import wandb

    if not 1 <= tp <= gpus:
        raise ValueError(f"--tp must be between 1 and {gpus}, got {tp}")
    with httpx.Client(base_url=api_addr, timeout=10.0) as client:
        info = _wandb_info(client)
        wandb.init(project=info["project"], group=info.get("group"), name=f"inf_node_{node_num}")
        names = [f"server/server_health_{node_num}_{i}" for i in range(gpus // tp)]
        health = dict.fromkeys(names, 0.0)
        logged_step, polls = 0, 0
        while max_polls is None or polls < max_polls:
            step = client.get("/status").json()["current_step"]
            if step > logged_step:
                update_wandb(health, step=step)
                logged_step = step
            time.sleep(interval_s)
            for i, name in enumerate(names):
                health[name] = _health(client, f"http://localhost:{base_port + i}{health_path}")
            polls += 1


def main(argv: list[str] | None = None) -> None:
    """Entry point; flags as Atropos 0.4's (``--api_addr``, ``--tp``, ``--node_num``)."""
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api_addr", required=True, help="trajectory API base URL")
    parser.add_argument("--tp", type=int, required=True, help="tensor-parallel size per server")
    parser.add_argument("--node_num", type=int, required=True, help="this node's number")
    parser.add_argument("--gpus", type=int, default=DEFAULT_GPUS, help="GPUs on this node")
    parser.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                        help="port of the node's first inference server")
    parser.add_argument("--health-path", default=DEFAULT_HEALTH_PATH,
                        help="path probed on each server")
    parser.add_argument("--interval-s", type=float, default=60.0, help="seconds between probes")
    args = parser.parse_args(argv)
    run(args.api_addr, args.tp, args.node_num, gpus=args.gpus, base_port=args.base_port,
        health_path=args.health_path, interval_s=args.interval_s)


if __name__ == "__main__":
    main()
