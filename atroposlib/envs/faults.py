"""Fault injection: make a seeded fraction of an env's rollouts fail, to test what becomes of them.

Wraps the per-member rollout of any env that rolls out its members through
:meth:`BaseEnv.run_rollouts <atroposlib.envs.base.BaseEnv.run_rollouts>` (the default
``collect_trajectories`` over ``collect_trajectory``, ``MultiTurnEnv`` episodes,
``SingleTurnEnv`` scoring). Each attempt of each member draws, from the seed alone, whether it
fails and how:

- ``kill``: the attempt raises at once, as the env's own code would (failed / ``env_error``);
- ``timeout``: it sleeps past ``rollout_timeout`` and is cancelled (failed / ``timeout``);
- ``corrupt``: its inference reply is unusable and the call raises
  :class:`InjectedInferenceError` (failed / ``inference``).

A faulted attempt never reaches the real rollout (no inference call, no scoring), so a high
rate costs little; in a ``SingleTurnEnv`` the rollout is the member's scoring (the group's
replies come from one request before it), so there a fault replaces the scoring of a sampled
reply. Draws depend on ``(seed, group number, member index, attempt)`` only: the
``k``-th group an env rolls out gets the same faults in every run with the same seed, whatever
the timing. Each injected fault can be appended to a JSONL log (one object per line:
``rollout_id``, ``attempt``, ``kind``, ``group``), so a test can check that no injected rollout
reached a trainer.

Three ways in (see ``docs/guides/rollout-outcomes.md``)::

    env = inject_faults(env, FaultSpec(rate=0.5))            # an instance
    FaultyEnv = inject_faults(MyEnv, FaultSpec(rate=0.1))    # a class (a subclass of it)
    ATROPOS_FAULTS="rate=0.5,kinds=kill+timeout,seed=3" python my_env.py serve ...

An env gets one wrapper however many times it is wrapped: wrapping again replaces the spec (the
later ``inject_faults`` wins), and when ``ATROPOS_FAULTS`` is set for an env that code already
wrapped, the variable's spec wins (the run-time choice over the code's); either replacement
logs one warning naming both specs.

Errors (part of :mod:`atroposlib.errors`' tree)::

    RolloutError
    └── InjectedFault               a ``kill`` fault (kind ``env_error``)
    InferenceError
    └── InjectedInferenceError      a ``corrupt`` fault (kind ``inference``)
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from atroposlib.envs.outcomes import new_rollout_ids
from atroposlib.errors import ConfigError, InferenceError, RolloutError

logger = logging.getLogger(__name__)

#: The environment variable the env command line reads (:func:`install_from_environ`).
FAULTS_ENV_VAR = "ATROPOS_FAULTS"
#: The faults, in the order a draw picks from: ``kill``, ``timeout``, ``corrupt``.
FAULT_KINDS = ("kill", "timeout", "corrupt")
#: The wire ``kind`` each fault's member fails with.
OUTCOME_KIND = {"kill": "env_error", "timeout": "timeout", "corrupt": "inference"}

E = TypeVar("E")


class InjectedFault(RolloutError):
    """A ``kill`` fault: the rollout raised as the env's own code would (kind ``env_error``)."""

    rollout_failure_kind = "env_error"


class InjectedInferenceError(InferenceError):
    """A ``corrupt`` fault: the inference reply was garbage and the call raised (kind ``inference``)."""


@dataclass(frozen=True)
class FaultSpec:
    """Which rollouts fail, and how.

    Attributes:
        rate: probability in ``[0, 1]`` that one attempt of one member fails (each attempt,
            retries included, draws on its own).
        kinds: the faults to pick from, uniformly (:data:`FAULT_KINDS`).
        seed: the draws' seed.
        log: a JSONL file each injected fault is appended to (None: none).

    Raises:
        ConfigError: ``rate`` outside ``[0, 1]``, no kinds, or an unknown kind.
    """

    rate: float
    kinds: tuple[str, ...] = FAULT_KINDS
    seed: int = 0
    log: str | None = None

    def __post_init__(self) -> None:
        """Validate the spec (see the class's Raises)."""
        if not 0.0 <= self.rate <= 1.0:
            raise ConfigError(f"fault rate must be in [0, 1], got {self.rate}")
        kinds = tuple(self.kinds)
        unknown = [k for k in kinds if k not in FAULT_KINDS]
        if not kinds or unknown:
            raise ConfigError(f"fault kinds must be some of {', '.join(FAULT_KINDS)}, got "
                              f"{'+'.join(kinds) or 'none'}")
        object.__setattr__(self, "kinds", kinds)

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """Read ``rate=0.5,kinds=kill+timeout,seed=3,log=faults.jsonl`` (only ``rate`` required).

        Raises:
            ConfigError: a part is not ``key=value``, a key is unknown, a value does not parse,
                or the spec is invalid; the message shows the expected form.
        """
        form = f"expected {FAULTS_ENV_VAR}='rate=0.5,kinds=kill+timeout+corrupt,seed=0,log=PATH'"
        values: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            try:
                if not sep or key not in ("rate", "kinds", "seed", "log"):
                    raise ValueError(part)
                values[key] = (float(value) if key == "rate" else int(value) if key == "seed"
                               else tuple(filter(None, value.split("+"))) if key == "kinds"
                               else value)
            except ValueError:
                raise ConfigError(f"bad fault spec part {part!r}: {form}") from None
        if "rate" not in values:
            raise ConfigError(f"fault spec {text!r} has no rate: {form}")
        return cls(**values)

    def describe(self) -> str:
        """One line for the logs: ``25% of rollout attempts (kill+timeout, seed 3)``."""
        return f"{100 * self.rate:g}% of rollout attempts ({'+'.join(self.kinds)}, seed {self.seed})"

    def draw(self, group: int, index: int, attempt: int) -> str | None:
        """The fault of attempt ``attempt`` of member ``index`` of the ``group``-th group, or None.

        Depends on the arguments and ``seed`` only (``random.Random`` seeded with a string).
        """
        rng = random.Random(f"{self.seed}/{group}/{index}/{attempt}")
        return rng.choice(self.kinds) if rng.random() < self.rate else None


@dataclass(frozen=True)
class Fault:
    """One injected fault (a line of the JSONL log)."""

    rollout_id: str
    attempt: int
    kind: str
    group: int


@dataclass
class FaultInjector:
    """Draws and applies the faults of one env (see the module docstring).

    Attributes:
        spec: what to inject.
        injected: every fault injected so far, in order.
        counts: injected faults by kind.
        groups: groups rolled out through it so far.
    """

    spec: FaultSpec
    injected: list[Fault] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    groups: int = 0

    def wrap(self, roll: Callable[[int], Awaitable[Any]], ids: list[str], timeout: float | None,
             stats: Any = None) -> Callable[[int], Awaitable[Any]]:
        """``roll`` for the next group: each call (one attempt of member ``i``) may fail instead.

        Args:
            roll: the group's per-member rollout, ``roll(i)``.
            ids: the members' rollout ids (logged with each fault).
            timeout: the env's ``rollout_timeout``; a ``timeout`` fault sleeps past it.
            stats: the env's counters (``faults_injected_<kind>`` += 1 per fault), or None.
        """
        group = self.groups
        self.groups += 1
        attempts: Counter[int] = Counter()

        async def faulty(i: int) -> Any:
            attempt = attempts[i]
            attempts[i] += 1
            kind = self.spec.draw(group, i, attempt)
            if kind is None:
                return await roll(i)
            self._record(Fault(ids[i], attempt, kind, group), stats)
            if kind == "kill":
                raise InjectedFault(f"injected fault: rollout {ids[i]} killed")
            if kind == "corrupt":
                raise InjectedInferenceError(f"injected fault: garbage inference reply for {ids[i]}")
            await asyncio.sleep((timeout or 0.0) + 1.0)  # cancelled by run_members' rollout_timeout
            raise TimeoutError(f"injected fault: rollout {ids[i]} hung")

        return faulty

    def _record(self, fault: Fault, stats: Any) -> None:
        self.injected.append(fault)
        self.counts[fault.kind] += 1
        if stats is not None:
            stats[f"faults_injected_{fault.kind}"] += 1
        if self.spec.log:
            line = json.dumps({"rollout_id": fault.rollout_id, "attempt": fault.attempt,
                               "kind": fault.kind, "group": fault.group}) + "\n"
            with Path(self.spec.log).open("a", encoding="utf-8") as out:
                out.write(line)  # closed at once: a kill -9 of the env loses no line


def _install(env: Any, injector: FaultInjector) -> FaultInjector | None:
    """Give ``env`` ``injector``; wrap ``env.run_rollouts`` on the instance unless it is wrapped.

    The wrapper reads ``env.fault_injector`` at every group, so a second install swaps the
    injector under the one wrapper instead of wrapping the wrapper (which would apply both
    specs, one after the other, to every attempt).

    Returns:
        The injector it replaced, or None when ``env`` had none.
    """
    previous = env.fault_injector if _wrapped(env) else None
    env.fault_injector = injector
    if previous is not None:
        return previous
    inner = env.run_rollouts

    async def run_rollouts(roll: Callable[[int], Awaitable[Any]], n: int,
                           ids: list[str] | None = None) -> Any:
        ids = list(ids) if ids is not None else new_rollout_ids(n)
        faulty = env.fault_injector.wrap(roll, ids, env.config.rollout_timeout,
                                         getattr(env, "stats", None))
        return await inner(faulty, n, ids=ids)

    run_rollouts.injects_faults = True  # type: ignore[attr-defined]
    env.run_rollouts = run_rollouts
    return None


def _wrapped(env: Any) -> bool:
    """Whether ``env``'s ``run_rollouts`` is already this module's wrapper."""
    return bool(getattr(vars(env).get("run_rollouts"), "injects_faults", False))


def inject_faults(target: E, spec: FaultSpec) -> E:
    """Make ``spec.rate`` of ``target``'s rollout attempts fail (see the module docstring).

    Idempotent: an env is wrapped once; wrapping an instance (or a class's instances) again
    replaces the spec, the later call wins, with one warning naming both specs. With
    ``ATROPOS_FAULTS`` set too, the variable's spec wins (:func:`install_from_environ`).

    Args:
        target: an env instance (wrapped in place and returned; its injector is
            ``env.fault_injector``) or an env class (a subclass is returned whose every
            instance gets its own injector).
        spec: what to inject.

    Returns:
        ``target`` (an instance) or the subclass (a class).

    Raises:
        TypeError: ``target`` has no ``run_rollouts`` (not a ``BaseEnv``).
    """
    if not callable(getattr(target, "run_rollouts", None)):
        raise TypeError(f"inject_faults needs a BaseEnv class or instance, got {target!r}")
    if isinstance(target, type):
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            target.__init__(self, *args, **kwargs)  # type: ignore[misc]
            _replace_in_code(self, spec)

        name = f"Faulty{target.__name__}"
        return type(target)(name, (target,), {"__init__": __init__, "__qualname__": name,
                                              "__module__": target.__module__,
                                              "__doc__": target.__doc__})
    _replace_in_code(target, spec)
    return target


def _replace_in_code(env: Any, spec: FaultSpec) -> None:
    previous = _install(env, FaultInjector(spec))
    if previous is not None and previous.spec != spec:
        logger.warning("inject_faults on a %s already injecting faults: one wrapper, the later "
                       "spec wins: %s (replaces %s)", type(env).__name__, spec.describe(),
                       previous.spec.describe())


def install_from_environ(env: E, environ: Mapping[str, str] | None = None) -> E:
    """Inject the faults ``ATROPOS_FAULTS`` asks for into ``env`` (nothing when unset or empty).

    The env command line calls this for every env it builds; it logs one warning naming the
    spec. When code already wrapped ``env`` (:func:`inject_faults`), the variable's spec
    replaces the code's under the same wrapper (faults are never applied twice), and the one
    warning names both.

    Raises:
        ConfigError: the variable does not parse (:meth:`FaultSpec.parse`).
        TypeError: ``env`` is not a ``BaseEnv`` class or instance.
    """
    text = (os.environ if environ is None else environ).get(FAULTS_ENV_VAR, "").strip()
    if not text:
        return env
    spec = FaultSpec.parse(text)
    if isinstance(env, type) or not callable(getattr(env, "run_rollouts", None)):
        logger.warning("%s is set: injecting faults into %s", FAULTS_ENV_VAR, spec.describe())
        return inject_faults(env, spec)  # a class: its subclass's spec is installed last, so wins
    previous = _install(env, FaultInjector(spec))
    if previous is None:
        logger.warning("%s is set: injecting faults into %s", FAULTS_ENV_VAR, spec.describe())
    else:
        logger.warning("%s is set: injecting faults into %s; it wins over the faults the code "
                       "injects (%s), applied once", FAULTS_ENV_VAR, spec.describe(),
                       previous.spec.describe())
    return env


__all__ = ["FAULTS_ENV_VAR", "FAULT_KINDS", "OUTCOME_KIND", "Fault", "FaultInjector", "FaultSpec",
           "InjectedFault", "InjectedInferenceError", "inject_faults", "install_from_environ"]
