"""The resolved ``atropos-launch`` config as a few console lines, printed when a run starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from atroposlib.launch.config import LaunchConfig


def describe_config(config: LaunchConfig, width: int = 100) -> list[str]:
    """The resolved config in a few lines for the console: the trainer's settings, each env's.

    Args:
        config: a validated config (overrides applied).
        width: lines are wrapped at this many characters.

    Returns:
        Lines without a trailing newline, continuation lines indented.
    """
    import textwrap

    def line(head: str, values: dict[str, Any]) -> list[str]:
        text = " ".join([head, *(f"{k}={_short(v)}" for k, v in values.items())])
        return textwrap.wrap(text, width, subsequent_indent="    ", break_on_hyphens=False,
                             break_long_words=False)

    lines = line(f"trainer ({config.trainer_name}):", config.trainer)
    for env in config.envs:
        lines += line(f"env {env.name}: {_relative(env.script)}", env.args)
    for section in config.inference:
        lines += line(f"inference {section.name} x{section.count}:", section.args)
    if config.eval_env:
        lines += line(f"eval_env: {config.eval_env}", config.eval_args)
    return lines


def unused_placements(config: LaunchConfig) -> list[str]:
    """The parts whose ``placement`` is set although the run is not on Ray (every part runs locally).

    Returns:
        Part names in start order (``api``, ``trainer``, then the envs); [] with ``--ray``.
    """
    if config.ray is not None:
        return []
    placed = [name for name, section in [("api", config.api), *((e.name, e) for e in config.envs)]
              if section.model_fields_set & {"placement"}]
    if "placement" in config.trainer:
        placed.insert(1, "trainer")
    return placed


def _short(value: Any) -> str:
    """A setting's value as YAML would spell it, on one line."""
    import json

    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value)


def _relative(path: str) -> str:
    """``path`` relative to the working directory when it lies under it."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path
