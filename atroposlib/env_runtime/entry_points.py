"""Environments by name: the ``atroposlib.environments`` entry-point group.

An installed distribution makes an environment runnable by name by declaring, in its
``pyproject.toml``::

    [project.entry-points."atroposlib.environments"]
    my_env = "my_package.my_module:MyEnv"

``atropos-env list`` then shows it and ``atropos-env my_env serve ...`` runs it. Discovery
reads installed metadata only (``importlib.metadata``); no environment module is imported
until one is run (or ``list --check`` asks for it). The one-line description comes from the
class docstring, read from the module's source without executing it.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING

from atroposlib.errors import ConfigError

if TYPE_CHECKING:
    from atroposlib.envs.base import BaseEnv

#: The entry-point group that maps an environment name to ``"module:Class"``.
ENTRY_POINT_GROUP = "atroposlib.environments"


class UnknownEnvironmentError(ConfigError):
    """No installed distribution registers an environment under the requested name."""


@dataclass(frozen=True)
class RegisteredEnv:
    """One registered environment.

    Attributes:
        name: the name it runs under (``atropos-env NAME ...``).
        target: ``"module:Class"`` as declared.
        distribution: the distribution that declares it (None when unknown).
        entry_point: the underlying entry point (``.load()`` imports the class).
    """

    name: str
    target: str
    distribution: str | None
    entry_point: EntryPoint

    @property
    def module(self) -> str:
        """The module part of ``target``."""
        return self.entry_point.module

    @property
    def class_name(self) -> str:
        """The class part of ``target`` (``""`` when the target names a module only)."""
        return self.entry_point.attr or ""


def registered_envs() -> dict[str, RegisteredEnv]:
    """Every environment registered by an installed distribution, sorted by name.

    When two distributions declare the same name, the first one ``importlib.metadata``
    reports (the one earliest on ``sys.path``) wins, like Python's own import rule.

    Returns:
        name -> :class:`RegisteredEnv`; empty when nothing is registered.
    """
    found: dict[str, RegisteredEnv] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in found:
            continue
        dist = getattr(ep, "dist", None)
        found[ep.name] = RegisteredEnv(
            name=ep.name,
            target=ep.value,
            distribution=dist.metadata["Name"] if dist is not None else None,
            entry_point=ep,
        )
    return dict(sorted(found.items()))


def unknown_env_message(name: str, known: list[str]) -> str:
    """``unknown environment NAME`` plus the closest registered names (or how to list them)."""
    if not known:
        return (
            f"unknown environment {name!r}: no environments are registered (install atroposlib "
            f"or a package declaring the {ENTRY_POINT_GROUP!r} entry-point group)"
        )
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}?" if close else "run `atropos-env list` to see them"
    return f"unknown environment {name!r}; {hint}"


def find_env(name: str) -> RegisteredEnv:
    """The registered environment called ``name``.

    Raises:
        UnknownEnvironmentError: no such name; the message suggests the closest names.
    """
    envs = registered_envs()
    if name not in envs:
        raise UnknownEnvironmentError(unknown_env_message(name, list(envs)))
    return envs[name]


def load_env(name: str) -> type[BaseEnv]:
    """Import and return the environment class registered as ``name``.

    Raises:
        UnknownEnvironmentError: no such name.
        ConfigError: the target cannot be imported, or is not a ``BaseEnv`` subclass.
    """
    from atroposlib.envs.base import BaseEnv

    entry = find_env(name)
    try:
        obj = entry.entry_point.load()
    except Exception as exc:  # noqa: BLE001 - any import failure is reported the same way
        raise ConfigError(
            f"environment {name!r} ({entry.target}) failed to import: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not (isinstance(obj, type) and issubclass(obj, BaseEnv)):
        raise ConfigError(
            f"environment {name!r} points at {entry.target}, which is not a BaseEnv subclass; "
            "the entry point must be 'module:EnvClass'"
        )
    return obj


def static_description(entry: RegisteredEnv) -> str:
    """First line of the class docstring, read from source without importing the module.

    Locating the module may import its parent packages (not the module itself). Returns
    ``""`` when the source is unavailable or the class is not defined literally there.
    """
    try:
        spec = importlib.util.find_spec(entry.module)
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return ""
    try:
        with open(spec.origin, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=spec.origin)
    except (OSError, SyntaxError, ValueError):
        return ""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == entry.class_name:
            return first_line(ast.get_docstring(node))
    return ""


def first_line(doc: str | None) -> str:
    """The first non-empty line of a docstring (``""`` for none)."""
    for line in (doc or "").strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


__all__ = [
    "ENTRY_POINT_GROUP",
    "RegisteredEnv",
    "UnknownEnvironmentError",
    "find_env",
    "first_line",
    "load_env",
    "registered_envs",
    "static_description",
    "unknown_env_message",
]
