"""Runners: what drives a ``BaseEnv`` (serve loop, process and evaluate runners, ``run_item``).

The env (:mod:`atroposlib.envs.base`) is the contract; everything here drives it from outside:
it owns the run state (:class:`~atroposlib.envs.run_state.RunState`) and the output sinks, and
never writes the env's attributes or config.
"""

from atroposlib.env_runtime.checks import check_env, check_group
from atroposlib.env_runtime.process import run_evaluate, run_process, start_run
from atroposlib.env_runtime.serve import (
    OUTBOX_MAX_GROUPS,
    SERVE_STOP_EVENT,
    ServeLoop,
    offpolicy_room,
)
from atroposlib.env_runtime.sinks import JsonlSink, OutboxSink, Sink, WandbSink, local_sinks
from atroposlib.env_runtime.step import Outcome, Skip, run_item

__all__ = [
    "check_env",
    "check_group",
    "OUTBOX_MAX_GROUPS",
    "SERVE_STOP_EVENT",
    "JsonlSink",
    "Outcome",
    "OutboxSink",
    "ServeLoop",
    "Sink",
    "Skip",
    "WandbSink",
    "local_sinks",
    "offpolicy_room",
    "run_evaluate",
    "run_item",
    "run_process",
    "start_run",
]
