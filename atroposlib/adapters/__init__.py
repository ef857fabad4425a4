"""Environments from other ecosystems run as Atropos environments, unmodified.

``atropos-env PREFIX:SPEC serve|process|evaluate`` builds the env class on the fly:

* ``verifiers:SPEC``: a verifiers (``verifiers.v1``) taskset or environment
  (:mod:`atroposlib.adapters.verifiers`);
* ``openenv:SPEC``: an OpenEnv environment server (:mod:`atroposlib.adapters.openenv`);
* ``gym:ID``: a Gymnasium environment with text observations
  (:mod:`atroposlib.adapters.gymnasium`).

Shared pieces (the token-tracking endpoint foreign rollout code samples through) live in
:mod:`atroposlib.adapters.common`. Nothing here is imported until an adapter is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from atroposlib.errors import ConfigError

if TYPE_CHECKING:
    from atroposlib.envs.base import BaseEnv

#: ``PREFIX`` -> ``"module:factory"``; the factory takes the spec and returns the env class.
ADAPTERS = {
    "verifiers": "atroposlib.adapters.verifiers:verifiers_env_class",
    "openenv": "atroposlib.adapters.openenv:openenv_env_class",
    "gym": "atroposlib.adapters.gymnasium:gym_env_class",
}

#: ``PREFIX`` -> ``(form, example, what it runs)``, as ``atropos-env list`` shows them.
ADAPTER_HELP = {
    "verifiers": ("verifiers:SPEC", "verifiers:reverse-text",
                  "a verifiers taskset or environment (pip install 'atroposlib[verifiers]')"),
    "openenv": ("openenv:SPEC", "openenv:my_env.server.app:app",
                "an OpenEnv environment server (pip install 'atroposlib[openenv]')"),
    "gym": ("gym:ID", "gym:Blackjack-v1", "a Gymnasium environment with text observations"),
}


def is_adapter_name(name: str) -> bool:
    """Whether ``name`` is ``PREFIX:SPEC`` for a known adapter prefix."""
    prefix, sep, _ = name.partition(":")
    return bool(sep) and prefix in ADAPTERS


def adapter_env_class(name: str) -> type[BaseEnv]:
    """The env class for ``PREFIX:SPEC`` (e.g. ``verifiers:reverse-text``, ``gym:Taxi-v4``).

    Raises:
        ConfigError: unknown prefix, empty spec, a missing optional dependency, or a spec the
            adapter cannot load (the message says which and how to fix it).
    """
    prefix, _, spec = name.partition(":")
    if prefix not in ADAPTERS:
        raise ConfigError(f"unknown adapter {prefix!r} in {name!r}; known: "
                          f"{', '.join(p + ':' for p in ADAPTERS)}")
    if not spec:
        raise ConfigError(f"{name!r}: give what to run after the colon, e.g. {prefix}:NAME")
    module_name, _, factory = ADAPTERS[prefix].partition(":")
    return getattr(importlib.import_module(module_name), factory)(spec)


__all__ = ["ADAPTERS", "ADAPTER_HELP", "adapter_env_class", "is_adapter_name"]
