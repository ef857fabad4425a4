"""Whether a started part answers yet: run-api's ``GET /info`` and an inference node's ``GET /health``.

Each probe makes one short request (2 s timeout, proxies ignored) and never raises: a part that
is still starting simply is not ready. :class:`~atroposlib.launch.orchestration.Launcher` polls
them while it watches the parts for an early exit.
"""

from __future__ import annotations

import os
from typing import Any

from atroposlib.api.settings import API_KEY_ENV


def auth_header() -> dict[str, str]:
    """``Authorization`` for run-api when ``$ATROPOS_API_KEY`` is set (it then requires it)."""
    key = os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def api_info(url: str) -> dict[str, Any] | None:
    """run-api's ``GET {url}/info`` as a dict (``batch_size`` > 0 once a trainer registered); None until it answers 200."""
    import httpx

    try:
        response = httpx.get(f"{url}/info", timeout=2.0, trust_env=False, headers=auth_header())
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def answers_health(root: str) -> bool:
    """True when ``GET {root}/health`` answers 200 (``root``: a server's URL without ``/v1``)."""
    import httpx

    try:
        return httpx.get(f"{root}/health", timeout=2.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


__all__ = ["answers_health", "api_info", "auth_header"]
