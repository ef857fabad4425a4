"""The trajectory API: FastAPI server (``build_app``), wire types and clients.

``atroposlib.api.app`` (as in Atropos 0.4, for ``uvicorn atroposlib.api:app``) is created on
first access, so importing the clients or models stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["app", "build_app"]


def __getattr__(name: str) -> Any:
    if name == "app":
        from atroposlib.api.server import app

        return app
    if name == "build_app":
        from atroposlib.api.factory import build_app

        return build_app
    raise AttributeError(f"module 'atroposlib.api' has no attribute {name!r}")
