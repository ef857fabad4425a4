"""Reading YAML files: the one loader, whose errors name the file and the line.

Every YAML file atroposlib reads (an env's ``--config``, an ``atropos-launch`` run file) goes
through :func:`load_yaml`, so a typo reads the same everywhere::

    run.yaml:4:1: not valid YAML: expected ',' or ']', but got '<stream end>' (while parsing a
    flow sequence that starts at line 3, column 7)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from atroposlib.errors import ConfigError


def load_yaml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """Read ``path`` as YAML whose top level is a mapping; an empty file gives ``{}``.

    Args:
        path: the file.
        what: how messages name it (``"config file"``, ``"--config"``).

    Returns:
        The mapping, as ``yaml.safe_load`` reads it (no Python objects are built).

    Raises:
        ConfigError: the file does not exist; it is not valid YAML (the message gives
            ``FILE:LINE:COLUMN``, 1-based, and what the parser found there); or its top level
            is not a mapping.
    """
    import yaml

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{what} {file} does not exist")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{_where(file, exc)}: not valid YAML: {_problem(exc)}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{file}: the top level must be a mapping of keys (key: value lines), got a "
            f"{type(data).__name__}"
        )
    return data


def _where(file: Path, exc: Exception) -> str:
    """``FILE:LINE:COLUMN`` (1-based) of a parser error, or ``FILE`` when it has no position."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f"{file}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(file)


def _problem(exc: Exception) -> str:
    """What the parser found, and while parsing what (without its own position lines)."""
    problem = getattr(exc, "problem", None)
    if problem is None:
        return str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    if not context:
        return str(problem)
    mark = getattr(exc, "context_mark", None)
    start = f" that starts at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem} ({context}{start})"


__all__ = ["load_yaml"]
