"""The uvicorn import target: ``uvicorn atroposlib.api.server:app``.

Settings come from ``$ATROPOS_API_SETTINGS`` (set by ``run-api --reload``), else defaults.
Code and tests should call :func:`atroposlib.api.factory.build_app` instead.
"""

from __future__ import annotations

from atroposlib.api.factory import build_app
from atroposlib.api.http_protocol import set_header_timeout
from atroposlib.api.settings import settings_from_env

_settings = settings_from_env()
set_header_timeout(_settings.header_timeout_s)  # this process's connections (run-api --reload)
app = build_app(_settings)
