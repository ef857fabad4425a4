"""Trainers by name: the ``atroposlib.trainers`` entry-point group that ``atropos-launch`` runs.

A trainer is an application built on this library, run by ``atropos-launch`` as a child
process. An installed distribution makes one launchable by name by declaring its settings
model in ``pyproject.toml``::

    [project.entry-points."atroposlib.trainers"]
    my_trainer = "my_package.config:MyTrainerConfig"

and ``pip install -e .`` (or any install) records it. The launch YAML picks it with
``trainer_name: my_trainer`` (default ``grpo``). The contract:

- the target is a pydantic model of the trainer's settings; the YAML's ``trainer:`` section
  is validated against it before anything starts;
- it has a ``run_module: ClassVar[str]``, the module ``python -m`` (or ``torchrun -m``) runs;
- that module takes every setting as a kebab-case flag (``--training-steps 3``, ``--no-x``
  for false) plus ``--api-url``, ``--run-dir`` and, unless ``vllm_url`` is set,
  ``--vllm-port``, which the launcher fills in.

Only the chosen trainer's settings module is imported; the others stay metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from pydantic import BaseModel

from atroposlib.errors import ConfigError

#: The entry-point group that maps a trainer name to its settings model (``"module:Class"``).
ENTRY_POINT_GROUP = "atroposlib.trainers"
#: The trainer a launch YAML gets without ``trainer_name``.
DEFAULT_TRAINER = "grpo"
_REGISTER = (f'register yours under [project.entry-points."{ENTRY_POINT_GROUP}"] in its '
             "package's pyproject.toml and `pip install -e .` that package")


class UnknownTrainerError(ConfigError):
    """No installed distribution registers a trainer under the requested name."""


@dataclass(frozen=True)
class Trainer:
    """One resolved trainer.

    Attributes:
        name: the name it is registered under (``trainer_name`` in the launch YAML).
        config_model: its settings model; validates the YAML's ``trainer:`` section.
        run_module: the module ``python -m`` runs to train.
    """

    name: str
    config_model: type[BaseModel]
    run_module: str


def select_trainer(name: str, registered: Iterable[EntryPoint]) -> EntryPoint:
    """The entry point registered as ``name`` among ``registered`` (nothing is imported).

    When two distributions declare the same name, the first one wins (the one earliest on
    ``sys.path``, as ``importlib.metadata`` lists them), like Python's own import rule.

    Args:
        name: the trainer name, e.g. ``"grpo"``.
        registered: entry points of the :data:`ENTRY_POINT_GROUP` group.

    Raises:
        UnknownTrainerError: one line naming the installed trainers (or saying there are none)
            and how to register one.
    """
    found: dict[str, EntryPoint] = {}
    for ep in registered:
        found.setdefault(ep.name, ep)
    if name in found:
        return found[name]
    if not found:
        raise UnknownTrainerError(f"trainer {name!r} is not registered: no trainers are "
                                  f"installed; run `pip install -e .` in the atroposlib checkout "
                                  f"(it registers {DEFAULT_TRAINER!r}), or {_REGISTER}")
    raise UnknownTrainerError(f"unknown trainer {name!r}; installed trainers: "
                              f"{', '.join(sorted(found))}; set trainer_name to one of them, or "
                              f"{_REGISTER}")


def load_trainer(name: str = DEFAULT_TRAINER,
                 registered: Iterable[EntryPoint] | None = None) -> Trainer:
    """Resolve trainer ``name`` and import its settings model.

    Args:
        name: the trainer name (``trainer_name`` in the launch YAML).
        registered: the entry points to choose from; None reads the installed metadata
            (``importlib.metadata.entry_points(group="atroposlib.trainers")``).

    Raises:
        UnknownTrainerError: no trainer of that name is registered.
        ConfigError: the target fails to import, is not a pydantic model, or has no
            ``run_module`` string.
    """
    if registered is None:
        registered = entry_points(group=ENTRY_POINT_GROUP)
    ep = select_trainer(name, registered)
    try:
        model = ep.load()
    except Exception as exc:  # noqa: BLE001 - any import failure is reported the same way
        raise ConfigError(f"trainer {name!r} ({ep.value}) failed to import: "
                          f"{type(exc).__name__}: {exc}; is its package installed "
                          "(pip install -e .)?") from exc
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ConfigError(f"trainer {name!r} points at {ep.value}, which is not a pydantic "
                          "model; the entry point must be 'module:SettingsModel'")
    run_module = getattr(model, "run_module", None)
    if not isinstance(run_module, str) or not run_module:
        raise ConfigError(f"trainer {name!r}: {ep.value} has no run_module; add "
                          "`run_module: ClassVar[str] = \"my_package.train\"` (the module "
                          "`python -m` runs) to the class")
    return Trainer(name=name, config_model=model, run_module=run_module)


__all__ = [
    "DEFAULT_TRAINER",
    "ENTRY_POINT_GROUP",
    "Trainer",
    "UnknownTrainerError",
    "load_trainer",
    "select_trainer",
]
