"""Score a run's recorded completions again with an env's scorer: which scores would change.

:func:`rescore` reads the replay bundles of a run (:mod:`example_trainer.bundles`), each holding
the batch as ``GET /batch`` served it, and for every group that carries its dataset item (the
wire's optional ``item`` field, put on every group on delivery while the env config's
``record_items`` is on) asks the env's
:meth:`~atroposlib.envs.base.BaseEnv.rescore_group` for each member's score now: no policy, no
inference server, no run-api. The env is built by name (an ``atroposlib.environments`` entry
point such as ``gsm8k``, ``module:Class``, or an ecosystem prefix) with its ``config_init()``
defaults and optional setting overrides; its ``setup`` runs only when asked (``setup=True``).

What ``rescore_group`` does depends on the kind of env (:mod:`atroposlib.envs.rescoring`):

* ``SingleTurnEnv``: what the env computes for a reply at training time, before
  ``finish_group``: ``reward_for`` (its ``score(item, completion)``, or ``truncated_reward``
  for a reply cut off at the budget) of each member, or its own ``score_group``. The completion
  is the last assistant message of the member's ``messages`` when the group carries them, else
  its trained tokens decoded with the env's tokenizer (special tokens skipped); a reply counts
  as cut off when its last trained token is not a special token (an end of turn).
* ``MultiTurnEnv``: its ``score_episode(item, messages)`` on each member's recorded transcript;
  an env without it (its reward comes from live tool or game state) is bad input, and the
  message names the hook.
* Any other ``BaseEnv`` (Atropos 0.4's idiom): its ``score(rollout_group_data)`` on member dicts
  rebuilt from the record (the item's fields plus ``messages``, ``finish_reason``, ``tokens``,
  ``masks``, ``logprobs``), or its own ``rescore_group`` override.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from example_trainer.bundles import BundleError, bundle_dir, list_steps, read_bundle


class RescoreError(Exception):
    """The run or the env cannot be rescored (bad input: ``atropos-replay`` exits 2)."""


@dataclass
class Change:
    """One completed member whose score the scorer gives differently now.

    Attributes:
        step: the bundle's step.
        group: the group's index in the served batch.
        member: the member's index in the group's lists.
        rollout_id: its stable rollout id (None for groups sent without rollout ids).
        old: the score recorded in the batch.
        new: the score the scorer gives now (None when it raised).
        error: the scorer's exception, as ``Type: message`` (None when it returned a score).
    """

    step: int
    group: int
    member: int
    rollout_id: str | None
    old: float
    new: float | None
    error: str | None = None


@dataclass
class StepResult:
    """What rescoring one step found.

    Attributes:
        step: the bundle's step.
        groups: groups rescored (those that carry an item).
        members: completed members rescored.
        changed: the members whose score changed (scorer errors included).
        without_item: groups skipped because they carry no item.
    """

    step: int
    groups: int = 0
    members: int = 0
    changed: list[Change] = field(default_factory=list)
    without_item: int = 0


def parse_settings(pairs: Iterable[str]) -> dict[str, Any]:
    """``["key=value", ...]`` -> ``{key: value}``; a value is JSON when it parses as JSON, else text.

    Raises:
        RescoreError: a pair without ``=``.
    """
    settings: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise RescoreError(f"--set {pair!r}: write KEY=VALUE, e.g. --set answer_format=boxed")
        try:
            settings[key.strip()] = json.loads(text)
        except json.JSONDecodeError:
            settings[key.strip()] = text
    return settings


def load_env_class(name: str) -> type:
    """The env class of ``name``: an entry-point name, ``module:Class``, or ``PREFIX:SPEC``.

    Raises:
        RescoreError: unknown name, a class that cannot be imported, or one that is not a
            :class:`~atroposlib.envs.base.BaseEnv` subclass.
    """
    import importlib

    from atroposlib.adapters import adapter_env_class, is_adapter_name
    from atroposlib.env_runtime.entry_points import load_env
    from atroposlib.envs.base import BaseEnv
    from atroposlib.errors import ConfigError

    try:
        if is_adapter_name(name):
            cls = adapter_env_class(name)
        elif ":" in name:
            module, _, attr = name.partition(":")
            try:
                cls = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as exc:
                raise RescoreError(f"--env {name!r}: cannot import {attr!r} from {module!r} "
                                   f"({type(exc).__name__}: {exc}); give module:Class of an "
                                   "importable env, or a name from `atropos-env list`") from exc
        else:
            cls = load_env(name)
    except ConfigError as exc:
        raise RescoreError(f"--env {name!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, BaseEnv)):
        kind = cls.__name__ if isinstance(cls, type) else type(cls).__name__
        raise RescoreError(
            f"--env {name!r} is {kind}, not a BaseEnv subclass: rescore calls the env's "
            "rescore_group(item, group), which atroposlib.envs.BaseEnv subclasses have; give an "
            "atroposlib env (SingleTurnEnv, MultiTurnEnv, or a BaseEnv with score() or "
            "rescore_group)")
    return cls


def build_env(cls: type, settings: dict[str, Any] | None = None) -> Any:
    """An instance of env ``cls`` with its ``config_init()`` defaults and ``settings`` applied.

    No network I/O: the env's inference servers are configured, never called, and ``setup`` is
    not run.

    Raises:
        RescoreError: a setting the env config does not have, or a value it refuses.
    """
    import difflib

    from pydantic import ValidationError

    from atroposlib.utils.flag_errors import validation_error_message

    config, servers = cls.config_init()
    settings = dict(settings or {})
    known = list(type(config).model_fields)
    for key in settings:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; {cls.__name__}'s settings: {', '.join(known)}"
            raise RescoreError(f"--set {key}: {type(config).__name__} has no setting {key!r}{hint}")
    try:
        config = type(config).model_validate({**config.model_dump(), **settings})
    except ValidationError as exc:
        raise RescoreError(validation_error_message(exc, None, source="--set")) from exc
    return cls(config, servers)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


async def rescore_group(env: Any, group: dict[str, Any]) -> list[tuple[float | None, str | None]]:
    """``(new score, error)`` of each completed member of ``group`` (which carries ``item``).

    The env's :meth:`~atroposlib.envs.base.BaseEnv.rescore_group` gives each member's score; a
    member the scorer raised for gives ``(None, "Type: message")``, one it left out
    ``(None, "left out by the scorer")``.

    Raises:
        RescoreError: the env cannot score recorded groups (the message names the method to
            implement), or answered with a different number of scores than members.
    """
    from atroposlib.envs.rescoring import RescoreUnsupported

    n = len(group["tokens"])
    try:
        scores = await env.rescore_group(group["item"], group)
    except RescoreUnsupported as exc:
        raise RescoreError(str(exc)) from exc
    except Exception as exc:  # noqa: BLE001 - a scorer's failure is reported, not fatal
        return [(None, _error(exc))] * n
    if len(scores) != n:
        raise RescoreError(f"{type(env).__name__}.rescore_group returned {len(scores)} score(s) for "
                           f"a group of {n}: return one per member of group['tokens']")
    out: list[tuple[float | None, str | None]] = []
    for score in scores:
        if isinstance(score, BaseException):
            out.append((None, _error(score)))
        elif score is None:
            out.append((None, "left out by the scorer"))
        else:
            out.append((float(score), None))
    return out


async def rescore_step(env: Any, step: int, batch: Sequence[dict[str, Any]]) -> StepResult:
    """Rescore every group of one served batch that carries its item."""
    result = StepResult(step)
    for g, group in enumerate(batch):
        if group.get("item") is None:
            result.without_item += 1
            continue
        result.groups += 1
        result.members += len(group["scores"])
        ids = group.get("rollout_ids") or [None] * len(group["scores"])
        for i, (old, (new, error)) in enumerate(zip(group["scores"], await rescore_group(env, group),
                                                    strict=True)):
            if error is not None or new != old:
                result.changed.append(Change(step, g, i, ids[i], float(old), new, error))
    return result


def select_steps(run_dir: str | Path, steps: Sequence[int] | None) -> list[int]:
    """The steps to rescore: ``steps`` (each must have a bundle), or every recorded one.

    Raises:
        RescoreError: no bundles, or a requested step without one.
    """
    recorded = list_steps(run_dir)
    if not recorded:
        raise RescoreError(f"no replay bundles in {bundle_dir(run_dir)}: give the directory of a "
                           "run the GRPO trainer recorded (it writes them unless --replay-bundles "
                           "null)")
    if not steps:
        return recorded
    missing = sorted(set(steps) - set(recorded))
    if missing:
        raise RescoreError(f"no bundle for step(s) {', '.join(map(str, missing))} in "
                           f"{bundle_dir(run_dir)}; recorded: {recorded[0]}..{recorded[-1]} "
                           f"({len(recorded)} bundles)")
    return sorted(set(steps))


def _load_tokenizer_if_needed(env: Any, groups: Sequence[dict[str, Any]]) -> None:
    """Load the env's tokenizer now when rescoring needs it (token-only groups, cut-off replies).

    Raises:
        RescoreError: it cannot be loaded (the message names the setting that fixes it).
    """
    from atroposlib.envs.multi_turn import MultiTurnEnv
    from atroposlib.envs.single_turn import SingleTurnEnv

    if isinstance(env, SingleTurnEnv):
        needed = (env.truncated_reward is not None or any(not g.get("messages") for g in groups)
                  or type(env).score_group is not SingleTurnEnv.score_group)
    else:  # an episode's transcript needs no tokenizer; rebuilding score()'s input does
        needed = not isinstance(env, MultiTurnEnv)
    if not needed:
        return
    try:
        env.tokenizer  # noqa: B018 - loads it
    except Exception as exc:  # noqa: BLE001 - any loading failure gets the same advice
        raise RescoreError(
            f"cannot load the env's tokenizer {env.config.tokenizer_name!r} ({type(exc).__name__}: "
            f"{exc}); rescoring decodes the recorded tokens with it: give the run's tokenizer with "
            "--set tokenizer_name=NAME_OR_DIR") from exc


def _echo_step(result: StepResult, echo: Any) -> None:
    """One line for the step, then one per changed member (rollout id, old -> new)."""
    skipped = f"; {result.without_item} group(s) without an item skipped" if result.without_item else ""
    echo(f"rescore: step {result.step}: {len(result.changed)} of {result.members} score(s) "
         f"changed{skipped}")
    for c in result.changed:
        new = f"error ({c.error})" if c.error is not None else repr(c.new)
        echo(f"  group {c.group} member {c.member} rollout {c.rollout_id}: {c.old!r} -> {new}")


NO_ITEMS = ("none of the {n} groups of the selected steps carries its dataset item (the wire's "
            "optional `item` field), which the scorer needs: groups carry it when an atroposlib "
            "env (any BaseEnv subclass, served by `serve` or `process`) sent them with "
            "--env.record_items true (the default) and items of at most 64 KiB of JSON; "
            "Atropos 0.4's own runner does not send it")


def rescore(run_dir: str | Path, env_name: str, steps: Sequence[int] | None = None,
            settings: dict[str, Any] | None = None, out: str | Path | None = None,
            setup: bool = False, echo: Any = print) -> list[StepResult]:
    """Rescore the recorded completions of ``run_dir``'s bundles with env ``env_name``.

    Args:
        run_dir: the run directory (holding ``bundles/``).
        env_name: entry-point name, ``module:Class`` or ``PREFIX:SPEC`` of a BaseEnv subclass.
        steps: the steps to rescore (None or empty: every recorded step).
        settings: env config overrides (field -> value) on top of ``config_init()``.
        out: write the report here as JSON (``env``, ``steps``, ``changed``, ``totals``).
        setup: await the env's ``setup()`` first (for a scorer that uses what it builds; it
            may load the env's dataset).
        echo: where the report lines go.

    Returns:
        One :class:`StepResult` per step, in step order.

    Raises:
        RescoreError: no bundles, an unknown step, a damaged bundle, an env that is unknown or
            not a BaseEnv, a bad setting, no selected group carrying its item, a
            tokenizer that cannot load, an env that cannot score recorded groups (the
            message names the method to implement), or (``setup``) an env whose ``setup()`` raised.
    """
    chosen = select_steps(run_dir, steps)
    env = build_env(load_env_class(env_name), settings)
    batches = []
    for step in chosen:
        try:
            batches.append((step, read_bundle(run_dir, step).header["batch"]))
        except BundleError as exc:
            raise RescoreError(f"cannot read the bundle of step {step}: {exc.detail}") from exc
    total = sum(len(batch) for _, batch in batches)
    if not any(g.get("item") is not None for _, batch in batches for g in batch):
        raise RescoreError(NO_ITEMS.format(n=total))
    _load_tokenizer_if_needed(env, [g for _, batch in batches for g in batch if g.get("item") is not None])
    echo(f"rescore: {type(env).__name__} on {len(chosen)} step(s) of {run_dir}")

    async def every_step() -> list[StepResult]:  # one event loop for the env's whole life
        if setup:
            try:
                await env.setup()
            except Exception as exc:  # noqa: BLE001 - the env's own failure, reported as bad input
                raise RescoreError(f"{type(env).__name__}.setup() raised {_error(exc)}; rescore "
                                   "without --setup, or fix what the env needs to set up") from exc
        results = []
        for step, batch in batches:
            results.append(await rescore_step(env, step, batch))
            _echo_step(results[-1], echo)
        return results

    results = asyncio.run(every_step())
    totals = {"steps": len(results), "groups": sum(r.groups for r in results),
              "members": sum(r.members for r in results),
              "changed": sum(len(r.changed) for r in results),
              "errors": sum(1 for r in results for c in r.changed if c.error is not None),
              "groups_without_item": sum(r.without_item for r in results)}
    echo(f"rescore: {totals['changed']} of {totals['members']} score(s) changed in "
         f"{totals['groups']} group(s) of {totals['steps']} step(s) ({totals['errors']} scorer "
         f"error(s); {totals['groups_without_item']} group(s) without an item skipped)")
    if out is not None:
        report = {"run_dir": str(run_dir), "env": env_name, "settings": settings or {},
                  "steps": [{"step": r.step, "groups": r.groups, "members": r.members,
                             "changed": len(r.changed), "groups_without_item": r.without_item}
                            for r in results],
                  "changed": [asdict(c) for r in results for c in r.changed], "totals": totals}
        Path(out).write_text(json.dumps(report, indent=2) + "\n")
    return results


__all__ = ["Change", "RescoreError", "StepResult", "build_env", "load_env_class", "parse_settings",
           "rescore", "rescore_group", "select_steps"]
