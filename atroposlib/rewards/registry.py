"""The reward-function registry: names -> ``RewardFunction`` classes, with lazy module loading."""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from atroposlib.rewards.reward_function import RewardFunction, registry_name

logger = logging.getLogger(__name__)

class _FunctionReward(RewardFunction):
    """Adapter turning a legacy plain function ``f(completions, **kw) -> list[float]``.

    Atropos 0.4 named it ``LegacyFunctionWrapper``; that name is kept as an alias.
    """

    def __init__(self, fn: Callable[..., Sequence[float]], weight: float = 1.0, name=None):
        super().__init__(weight=weight, name=name or fn.__name__)
        self._fn = fn

    def compute(self, completions, **kwargs):
        return list(self._fn(completions, **kwargs))


class RewardRegistry:
    """Maps names to reward classes (or legacy functions) and builds configured instances.

    Names come from :func:`~atroposlib.rewards.reward_function.registry_name`
    (``AccuracyReward`` -> ``accuracy``). Unknown names are looked up by importing
    ``atroposlib.rewards.{name}`` or ``{name}_reward`` and then reading what that
    module registered with :meth:`register`. Upstream instead registered the alphabetically
    first ``RewardFunction`` subclass of the module under the requested name, so
    ``create("r1")`` returned ``AccuracyXReward``; here the module's own registrations win and
    nothing is ever registered under a name it did not declare.
    """

    def __init__(self, package: str = "atroposlib.rewards"):
        self._package = package
        self._entries: dict[str, type[RewardFunction] | Callable[..., Sequence[float]]] = {}

    def register(self, obj=None, *, name: str | None = None):
        """Register a ``RewardFunction`` subclass or a plain function; usable as a decorator.

        Args:
            obj: the class or function (omit to use ``@registry.register(name="x")``).
            name: registry name; defaults to :func:`registry_name` for classes and the
                function name for functions.

        Returns:
            ``obj`` unchanged (or a decorator when ``obj`` is None).

        Raises:
            TypeError: ``obj`` is neither a ``RewardFunction`` subclass nor callable.
        """

        def _do(target):
            if inspect.isclass(target):
                if not issubclass(target, RewardFunction):
                    raise TypeError(
                        f"{target.__name__} is not a RewardFunction subclass; subclass "
                        "atroposlib.rewards.RewardFunction and implement compute()"
                    )
                key = name or registry_name(target)
            elif callable(target):
                key = name or target.__name__
            else:
                raise TypeError(f"cannot register {target!r}: not a class or function")
            self._entries[key.lower()] = target
            return target

        return _do if obj is None else _do(obj)

    def _lazy_load(self, name: str) -> None:
        for module_name in (name, f"{name}_reward"):
            try:
                importlib.import_module(f"{self._package}.{module_name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{self._package}.{module_name}":
                    raise  # the module exists but one of its imports is missing
                continue
            if name in self._entries:
                return

    def get(self, name: str) -> type[RewardFunction] | Callable[..., Sequence[float]]:
        """Return the class (or legacy function) registered as ``name``, loading lazily.

        Raises:
            KeyError: nothing is registered under ``name``; the message lists the known names.
        """
        key = name.lower()
        if key not in self._entries:
            self._lazy_load(key)
        if key not in self._entries:
            _import_builtin_modules()  # e.g. "formatreasoning" lives in r1_reward.py
        if key not in self._entries:
            raise KeyError(
                f"unknown reward function {name!r}; registered: {', '.join(self.list_registered())}"
            )
        return self._entries[key]

    def create(self, spec: str | Mapping[str, Any] | RewardFunction, **defaults: Any):
        """Build a reward instance from a name or a config dict.

        Args:
            spec: a name (``"accuracy"``), a dict ``{"type": name, "params": {...}, **more}``
                (keys besides ``type``/``params``, e.g. ``weight``, are options too), or an
                existing instance (returned as is).
            **defaults: options applied unless the spec overrides them.

        Returns:
            A :class:`RewardFunction` instance.

        Raises:
            KeyError: unknown name.
            ValueError: a dict spec without ``type``.
            TypeError: an option the reward does not accept.
        """
        if isinstance(spec, RewardFunction):
            return spec
        if isinstance(spec, str):
            name, options = spec, {}
        elif isinstance(spec, Mapping):
            if "type" not in spec:
                raise ValueError(
                    f"reward config {dict(spec)!r} has no 'type'; write e.g. "
                    "{'type': 'accuracy', 'weight': 1.0}"
                )
            name = spec["type"]
            options = {k: v for k, v in spec.items() if k not in ("type", "params")}
            options.update(spec.get("params") or {})
        else:
            raise TypeError(f"reward spec must be a name or a dict, got {type(spec).__name__}")
        target = self.get(name)
        kwargs = {**defaults, **options}
        if inspect.isclass(target):
            return target(**kwargs)
        return _FunctionReward(target, **kwargs)

    def list_registered(self) -> list[str]:
        """Return the registered names, after importing every built-in reward module."""
        _import_builtin_modules()
        return sorted(self._entries)

    def load_required_functions(self, config: Any) -> list[RewardFunction]:
        """Instantiate every reward named in ``config.reward_funcs`` (or a plain list).

        Args:
            config: an object with a ``reward_funcs`` attribute, a mapping with that key, or
                an iterable of specs accepted by :meth:`create`.
        """
        if isinstance(config, Mapping):
            specs = config.get("reward_funcs", [])
        elif hasattr(config, "reward_funcs"):
            specs = config.reward_funcs
        else:
            specs = config
        return [self.create(s) for s in _as_list(specs)]


def _as_list(specs: Any) -> list[Any]:
    if specs is None:
        return []
    if isinstance(specs, str | Mapping):
        return [specs]
    if isinstance(specs, Iterable):
        return list(specs)
    raise TypeError(f"expected a list of reward specs, got {type(specs).__name__}")


_BUILTIN_MODULES = (
    "accuracy_reward",
    "format_reward",
    "cosine_length_reward",
    "repetition_penalty_reward",
    "reasoning_steps_reward",
    "r1_reward",
    "combined_reward",
    "cascading_r1_math_reward",
    "chandas_meter_reward",
    "cosine_scaled_reward",
    "crossword_format_reward",
)


def _import_builtin_modules() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(f"atroposlib.rewards.{module}")


LegacyFunctionWrapper = _FunctionReward

#: The process-wide registry; ``@registry.register`` adds to it.
registry = RewardRegistry()
