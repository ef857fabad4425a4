"""Small helpers of the learning bench's runners: reading a log that may not exist yet."""

from __future__ import annotations

from pathlib import Path


def read(path: Path) -> str:
    """A file's text ("" when it does not exist yet)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
