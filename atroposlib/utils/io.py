"""Small I/O helpers: JSON lines encoding of groups and HTTP response checking."""

from __future__ import annotations

import logging
from typing import Any

import orjson

logger = logging.getLogger(__name__)


def dumps_line(record: Any) -> str:
    """Encode one record as a JSON line (newline-terminated), numpy arrays included.

    Raises:
        TypeError: the record holds something JSON cannot represent.
    """
    return orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE).decode()


def parse_http_response(response: Any, logger_: logging.Logger | None = None) -> Any:
    """Return the JSON body of a 2xx ``httpx.Response``; log the body and raise otherwise.

    Raises:
        httpx.HTTPStatusError: the status is not 2xx (so tenacity can retry it).
    """
    try:
        response.raise_for_status()
    except Exception:
        (logger_ or logger).error("HTTP %s: %s", response.status_code, response.text[:2000])
        raise
    return response.json()


__all__ = ["dumps_line", "parse_http_response"]
