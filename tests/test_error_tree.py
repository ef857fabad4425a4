"""One error tree: every public exception atroposlib defines derives from ``AtroposError``.

Callers catch ``AtroposError`` to catch any error of the library (and the built-in base a
class also keeps, e.g. ``ConfigError`` is a ``ValueError``). Warnings have their own root,
``AtroposWarning`` (a ``UserWarning``), so ``warnings.filterwarnings`` can name them all.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import atroposlib
from atroposlib.errors import AtroposError, AtroposWarning


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(atroposlib.__path__, "atroposlib."):
        if info.name.rsplit(".", 1)[-1] == "__main__":  # importing it would run the command
            continue
        names.append(info.name)
    return names


def _public_exceptions() -> tuple[list[type[BaseException]], list[str]]:
    found: dict[str, type[BaseException]] = {}
    skipped = []
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # an optional dependency (gradio, torch ...) is missing
            if (exc.name or "").split(".")[0] == "atroposlib":
                raise
            skipped.append(f"{name} ({exc.name})")
            continue
        for attr, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__.startswith("atroposlib.") and not attr.startswith("_")
                    and not value.__name__.startswith("_")):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[k] for k in sorted(found)], skipped


def test_the_walk_sees_the_library():
    names = _modules()
    assert "atroposlib.api.errors" in names and "atroposlib.env_runtime.step" in names
    classes, _ = _public_exceptions()
    assert AtroposError in classes and len(classes) > 20


def test_every_public_exception_derives_from_atropos_error():
    classes, skipped = _public_exceptions()
    outside = [f"{c.__module__}.{c.__qualname__}{tuple(b.__name__ for b in c.__bases__)}"
               for c in classes if not issubclass(c, Warning) and not issubclass(c, AtroposError)]
    assert not outside, (
        "these exceptions do not derive from atroposlib.errors.AtroposError (add it as the first "
        f"base, keeping the built-in one callers catch): {outside}; modules not imported: {skipped}"
    )


def test_every_public_warning_derives_from_atropos_warning():
    classes, _ = _public_exceptions()
    outside = [f"{c.__module__}.{c.__qualname__}" for c in classes
               if issubclass(c, Warning) and not issubclass(c, AtroposWarning)]
    assert not outside, f"warnings outside atroposlib.errors.AtroposWarning: {outside}"


@pytest.mark.parametrize(("name", "builtin"), [
    ("atroposlib.errors.ConfigError", ValueError),
    ("atroposlib.envs.config.FrozenConfigError", AttributeError),
    ("atroposlib.tools.rollouts.RolloutFormatError", ValueError),
    ("atroposlib.launch.supervision.LaunchError", RuntimeError),
])
def test_built_in_bases_that_callers_catch_stay(name, builtin):
    module, _, attr = name.rpartition(".")
    cls = getattr(importlib.import_module(module), attr)
    assert issubclass(cls, builtin) and issubclass(cls, AtroposError)
