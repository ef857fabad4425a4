"""The uvicorn import target: ``uvicorn atroposlib.api.server:app``.

Settings come from ``$ATROPOS_API_SETTINGS`` (set by ``run-api --reload``), else defaults.
Code and tests should call :func:`atroposlib.api.factory.build_app` instead.

Atropos 0.4 defined the API's routes and wire models in this module; code written against it
imports them from here, so they are re-exported under Atropos 0.4's names. The route functions
are this package's (from :mod:`atroposlib.api.routes`): they take the API state as a FastAPI
dependency (``state``), where Atropos 0.4's used module globals. ``status`` is
``fastapi.status`` (the status-code constants), as in Atropos 0.4.
"""

from __future__ import annotations

# Third-party names Atropos 0.4's module imported (code sometimes imports them from here); this
# module imports FastAPI anyway (it builds the app), so they cost nothing extra.
from fastapi import FastAPI, status  # noqa: F401
from fastapi.middleware.cors import CORSMiddleware  # noqa: F401
from fastapi.middleware.gzip import GZipMiddleware  # noqa: F401
from fastapi.responses import PlainTextResponse  # noqa: F401
from pydantic import BaseModel, field_validator  # noqa: F401
from starlette.datastructures import MutableHeaders  # noqa: F401
from starlette.types import Receive, Scope, Send  # noqa: F401

from atroposlib.api.factory import build_app
from atroposlib.api.http_protocol import set_header_timeout
from atroposlib.api.middleware import GZipRequestMiddleware
from atroposlib.api.models import EnvIdentifier, Info, RegisterEnv, Registration, ScoredData, Status
from atroposlib.api.routes.batch import batch as get_batch
from atroposlib.api.routes.data import latest_example as get_latest_example
from atroposlib.api.routes.data import reset_data, scored_data, scored_data_list
from atroposlib.api.routes.register import disconnect_env, register
from atroposlib.api.routes.register import register_env as register_env_url
from atroposlib.api.routes.status import info, root, wandb_info
from atroposlib.api.routes.status import status as get_status
from atroposlib.api.routes.status import status_env as get_status_env
from atroposlib.api.settings import settings_from_env
from atroposlib.api.utils import (
    find_groups_summing_to_target,
    grab_batch_with_minimum_allocations,
    grab_exact_from_heterogeneous_queue,
)
from atroposlib.api.views import MIN_ENV_WEIGHT

_settings = settings_from_env()
set_header_timeout(_settings.header_timeout_s)  # this process's connections (run-api --reload)
app = build_app(_settings)

__all__ = [
    "MIN_ENV_WEIGHT",
    "EnvIdentifier",
    "GZipRequestMiddleware",
    "Info",
    "RegisterEnv",
    "Registration",
    "ScoredData",
    "Status",
    "app",
    "disconnect_env",
    "find_groups_summing_to_target",
    "get_batch",
    "get_latest_example",
    "get_status",
    "get_status_env",
    "grab_batch_with_minimum_allocations",
    "grab_exact_from_heterogeneous_queue",
    "info",
    "register",
    "register_env_url",
    "reset_data",
    "root",
    "scored_data",
    "scored_data_list",
    "wandb_info",
]
