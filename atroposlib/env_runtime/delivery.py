"""Delivery: checked groups -> prepared, normalised, recorded, written to the run's sinks and outbox.

The one path a scored group takes after the runner checked it (:func:`~atroposlib.env_runtime.step.run_item`):

1. each group gets its dataset item (:func:`record_items`, when the env config's
   ``record_items`` is on), whatever kind of env made it; then the env's
   ``prepare_checked_groups`` hook changes the groups in place (a teacher's log-probs, for
   instance);
2. each group is normalised (every optional key present) and recorded in the run's counters;
3. it is written to every sink of the run (JSONL, W&B) and, in serve mode, to the outbox the
   sender drains, with the ``policy_version`` it was sampled at.

The serve worker and the ``process`` runner call :func:`deliver_groups`. An env that sends
groups itself calls ``BaseEnv.handle_send_to_api``, which checks them and then takes the same
path (:func:`deliver_checked`, looked up as the ``"deliver"`` runner, since the env contract
does not import its runtime). An env class that overrides ``handle_send_to_api`` keeps it: the
runners then hand their groups to that override, as Atropos 0.4's runners did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from atroposlib.envs.run_state import ROLLOUT_POLICY_VERSION, RunState
from atroposlib.inference.policy_version import oldest_served_version

if TYPE_CHECKING:
    from atroposlib.envs.base import BaseEnv
    from atroposlib.envs.groups import CheckedGroups, ScoredDataGroup


async def deliver_groups(env: BaseEnv, groups: CheckedGroups, item: Any, *, send_to_api: bool,
                         check_length: bool = True) -> list[ScoredDataGroup]:
    """Deliver the groups a runner checked (see the module); returns the accepted ones.

    Args:
        env: the env whose runner checked ``groups``.
        groups: the checked groups of one item (``Outcome.groups``).
        item: the item they were sampled for (the sinks record it).
        send_to_api: queue them for the API (serve mode) besides writing the sinks.
        check_length: passed on to an overriding ``handle_send_to_api`` (its
            ``abort_on_any_max_length_exceeded``).

    Raises:
        RuntimeError: ``send_to_api`` outside the serve loop (there is no outbox).
    """
    from atroposlib.envs.base import BaseEnv

    if not groups:
        return []
    record_items(env, groups, item)
    if type(env).handle_send_to_api is not BaseEnv.handle_send_to_api:
        return await env.handle_send_to_api(groups, item, do_send_to_api=send_to_api,
                                            abort_on_any_max_length_exceeded=check_length)
    return await deliver_checked(env, groups, item, send_to_api)


async def deliver_checked(env: BaseEnv, groups: CheckedGroups, item: Any,
                          send_to_api: bool) -> list[ScoredDataGroup]:
    """Steps 1-3 of the module docstring for checked ``groups``; returns the accepted groups.

    Raises:
        RuntimeError: ``send_to_api`` outside the serve loop (there is no outbox).
    """
    record_items(env, groups, item)
    await env.prepare_checked_groups(groups)
    accepted = env._run_state.accept(groups, env.config.include_messages, env.tokenizer.decode)
    await write_groups(env._run_state, accepted, item, send_to_api)
    return accepted


def record_items(env: BaseEnv, groups: list[Any], item: Any) -> None:
    """Put ``item`` on each of ``groups`` (the wire's optional ``item`` field) for rescoring.

    Only when the env config's ``record_items`` is on (the default; a config class without
    the field counts as on), and only for a group without an ``item`` yet: the value is the
    item after a JSON round trip, left off (counted in ``env.stats["items_not_recorded"]``,
    logged once) when it is not JSON or passes 64 KiB
    (:func:`~atroposlib.envs.groups.record_item`). A group the item is left off keeps the
    keys it had (a stock group keeps its 14).
    """
    from atroposlib.envs.groups import record_item

    if item is None or not getattr(env.config, "record_items", True):
        return
    for group in groups:
        if isinstance(group, dict):
            record_item(group, item, env.stats)


async def write_groups(state: RunState, groups: list[Any], item: Any, send_to_api: bool) -> None:
    """Write accepted ``groups`` to every sink of ``state``, then (``send_to_api``) its outbox.

    Each group queued for the API gets ``policy_version`` (unless it already has one): the
    oldest policy version the inference servers reported for this item's completions
    (:func:`~atroposlib.inference.policy_version.oldest_served_version`: an
    ``atropos-inference-node`` tags each answer with the version of the weights that produced
    it, and a group is as stale as its stalest rollout); without such a report, the trainer
    step when its rollout started (:data:`~atroposlib.envs.run_state.ROLLOUT_POLICY_VERSION`),
    else ``state.curr_step``.

    Raises:
        RuntimeError: ``send_to_api`` without an outbox (only the serve loop has one).
    """
    for group in groups:
        for sink in state.sinks:
            await sink.write(group, item)
    if not (send_to_api and groups):
        return
    if state.outbox is None:
        raise RuntimeError(
            "handle_send_to_api(do_send_to_api=True) needs the serve loop; use "
            "do_send_to_api=False outside `serve`"
        )
    version = oldest_served_version()
    if version is None:
        version = ROLLOUT_POLICY_VERSION.get()
    for group in groups:
        if group.get("policy_version") is None:
            group["policy_version"] = state.curr_step if version is None else version
        await state.outbox.write(group, item)


__all__ = ["deliver_checked", "deliver_groups", "record_items", "write_groups"]
