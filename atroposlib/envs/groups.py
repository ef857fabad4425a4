"""Scored groups: the ``ScoredDataGroup``/``ScoredDataItem`` wire shapes and the pure checks on them.

Everything here is a pure function of a group and a few limits, so the env contract
(:mod:`atroposlib.envs.base`), the runners (:mod:`atroposlib.env_runtime`) and ``check_env`` share
one definition of what a valid group is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

from atroposlib.api.models import IGNORE_INDEX, MASKED_LOGPROB, MAX_ITEM_BYTES, free_json_error
from atroposlib.api.shapes import group_shape_error
from atroposlib.errors import RolloutError
from atroposlib.type_definitions import REFERENCE_KEY, Item, Message

logger = logging.getLogger(__name__)


class ScoredDataGroup(TypedDict, total=False):
    """One scored group of rollouts, as sent to the API.

    Shapes: ``G`` sequences, ``T_i`` tokens in sequence ``i``, ``K`` teacher top-k.

    Keys:
        tokens: ``[G][T_i]`` prompt + completion token ids.
        masks: ``[G][T_i]`` labels (the wire name is ``masks``): the token id at trained
            positions, ``-100`` (the ignore index) at untrained ones; not a 0/1 mask.
        scores: ``[G]`` scalar rewards.
        advantages: ``[G][T_i]`` optional per-token advantages.
        ref_logprobs: ``[G][T_i]`` optional reference log-probs.
        messages: ``[G]`` optional chat transcripts.
        generation_params: optional sampling parameters (e.g. ``{"temperature": 1.0}``).
        inference_logprobs: ``[G][T_i]`` sampler log-probs, ``1.0`` at masked positions.
        group_overrides: optional per-group overrides (``group_size``, ``temperature`` ...).
        overrides: ``[G]`` optional per-sequence overrides.
        images: optional images.
        distill_token_ids: ``[G][T_i][K]`` teacher top-k token ids.
        distill_logprobs: ``[G][T_i][K]`` teacher top-k log-probs.
        policy_version: trainer step of the weights that generated the group (an atroposlib
            extension that stock Atropos servers ignore). In serve mode it is set to the step
            the env knew when the rollout started, unless the env already set it.
        rollout_ids: ``[G]`` stable id of each member in the lists (an atroposlib extension,
            like ``attempts`` and ``excluded``; see :mod:`atroposlib.envs.outcomes`).
        attempts: ``[G]`` attempt of each member in the lists (0: first try).
        excluded: members kept out of the lists: masked (weighted 0, kept for inspection) or
            failed (no score), as ``ExcludedMember`` dicts.
        item: the dataset item the group was sampled for, as JSON (an atroposlib extension
            that stock servers ignore; :func:`record_item`), so ``atropos-replay rescore`` can
            score the recorded completions again.
    """

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: list[list[float]] | None
    ref_logprobs: list[list[float]] | None
    messages: list[list[Message]] | None
    generation_params: dict[str, Any] | None
    inference_logprobs: list[list[float]] | None
    group_overrides: dict[str, Any] | None
    overrides: list[dict[str, Any]] | None
    images: Any | None
    distill_token_ids: list[list[list[int]]] | None
    distill_logprobs: list[list[list[float]]] | None
    policy_version: int | None
    rollout_ids: list[str] | None
    attempts: list[int] | None
    excluded: list[dict[str, Any]] | None
    item: Any | None


class ScoredDataItem(TypedDict, total=False):
    """One scored rollout, returned by ``collect_trajectory`` (plus logprobs).

    Keys: ``tokens [T]``, ``masks [T]`` (labels: the token id where trained, ``-100`` where
    not), ``scores`` (float), and optional ``advantages [T]``,
    ``ref_logprobs [T]``, ``inference_logprobs [T]`` (1.0 at masked positions; carried into
    the group, unlike upstream), ``messages``, ``group_overrides``, ``overrides``, ``images``,
    ``distill_token_ids [T][K]``, ``distill_logprobs [T][K]``.
    """

    tokens: list[int]
    masks: list[int]
    scores: float
    advantages: list[float] | None
    ref_logprobs: list[float] | None
    inference_logprobs: list[float] | None
    messages: list[Message] | None
    group_overrides: dict[str, Any] | None
    overrides: dict[str, Any] | None
    images: Any | None
    distill_token_ids: list[list[int]] | None
    distill_logprobs: list[list[float]] | None


#: Per-sequence optional fields aggregated from ScoredDataItems into a group.
ITEM_LIST_FIELDS = (
    "advantages",
    "ref_logprobs",
    "inference_logprobs",
    "messages",
    "overrides",
    "images",
    "distill_token_ids",
    "distill_logprobs",
)
#: Optional group keys set to None when absent before sending.
OPTIONAL_GROUP_KEYS = tuple(k for k in ScoredDataGroup.__annotations__
                             if k not in ("tokens", "masks", "scores", "policy_version",
                                          "rollout_ids", "attempts", "excluded", "item"))


def aggregate_items(items: list[ScoredDataItem]) -> ScoredDataGroup:
    """Aggregate ``G`` rollouts (``ScoredDataItem``) into one group.

    ``tokens``/``masks``/``scores`` always; each optional per-sequence field when every item
    has it (None when no item has it); ``group_overrides`` merged (later items win).

    Raises:
        RolloutError: items disagree on an optional field (some set it, others not).
    """
    group = ScoredDataGroup(
        tokens=[list(i["tokens"]) for i in items],
        masks=[list(i["masks"]) for i in items],
        scores=[float(i["scores"]) for i in items],
    )
    for key in ITEM_LIST_FIELDS:
        values = [i.get(key) for i in items]
        present = [v is not None for v in values]
        if all(present):
            group[key] = values
        elif any(present):
            raise RolloutError(
                f"{sum(present)} of {len(items)} rollouts set {key!r} and the others did "
                f"not; set {key} on every ScoredDataItem or on none"
            )
        else:
            group[key] = None
    overrides: dict[str, Any] = {}
    for item in items:
        overrides.update(item.get("group_overrides") or {})
    group["group_overrides"] = overrides or None
    group["generation_params"] = None
    return group


def gather_rollouts(results: Sequence[Any]) -> tuple[list[ScoredDataItem] | None, list[Item]]:
    """Check ``collect_trajectory`` results and split them into rollouts and backlog items.

    Args:
        results: ``G`` results, each ``(ScoredDataItem | None, backlog_items)``.

    Returns:
        ``(items, backlog)``; ``items`` is None when a rollout returned None (the group is
        dropped), and ``backlog`` holds the backlog items seen up to then.

    Raises:
        RolloutError: a result is not a pair, or its item is not a dict.
    """
    backlog: list[Item] = []
    items: list[ScoredDataItem] = []
    for result in results:
        if not isinstance(result, tuple) or len(result) != 2:
            raise RolloutError(
                "collect_trajectory must return (ScoredDataItem | None, backlog_items), "
                f"got {type(result).__name__}"
            )
        scored, extra = result
        backlog.extend(extra or [])
        if scored is None:
            return None, backlog
        if not isinstance(scored, dict):
            raise RolloutError(
                f"collect_trajectory returned {type(scored).__name__}; return a "
                "ScoredDataItem dict with tokens, masks and scores"
            )
        items.append(scored)
    return items, backlog


def reject_reason(
    group: ScoredDataGroup,
    group_size: int,
    ensure_scores_are_not_same: bool,
    max_seq_len: int = -1,
) -> tuple[str, str] | None:
    """Why a group must be dropped, as ``(counter_key, message)``; None when it is usable.

    Keys: ``invalid`` (missing tokens/masks/scores or ragged rows), ``wrong_size`` (not
    ``group_size`` sequences, or ``group_overrides["group_size"]``, counting the members in
    ``excluded``), ``same_scores`` (all
    ``G > 1`` scores equal while ``ensure_scores_are_not_same``: no learning signal),
    ``too_long`` (a sequence of ``>= max_seq_len`` tokens, the trainer's limit; only checked
    when ``max_seq_len > 0``).
    """
    for key in ("tokens", "masks", "scores"):
        if key not in group or group[key] is None:
            return "invalid", f"group has no {key!r}"
    problem = group_shape_error(group)  # type: ignore[arg-type]
    if problem:
        return "invalid", problem
    expected = int((group.get("group_overrides") or {}).get("group_size", group_size))
    excluded = len(group.get("excluded") or ())
    if len(group["tokens"]) + excluded != expected:
        return (
            "wrong_size",
            f"group has {len(group['tokens'])} sequences"
            + (f" and {excluded} excluded members" if excluded else "")
            + f", expected {expected} (set group_overrides['group_size'] for variable-size groups)",
        )
    scores = group["scores"]
    if ensure_scores_are_not_same and len(scores) > 1 and len(set(scores)) <= 1:
        return "same_scores", "all scores are identical (no learning signal)"
    if max_seq_len > 0:
        longest = max(len(t) for t in group["tokens"])
        if longest >= max_seq_len:
            return "too_long", f"a sequence has {longest} tokens >= the trainer's max_token_len {max_seq_len}"
    return None


class CheckedGroups(list):
    """Groups that passed :func:`check_groups`: a list that remembers it was checked.

    The runners check each group once (in ``run_item``) and hand the result on;
    :func:`check_groups` returns such a list as it is, so ``handle_send_to_api`` (and any
    override that passes the list on) does not check the same groups again.

    Attributes:
        dropped: ``(reason, message)`` for each group the check dropped (reason as in
            :func:`reject_reason`).
    """

    def __init__(self, groups: Sequence[ScoredDataGroup] = (), dropped: Sequence[tuple[str, str]] = ()):
        """Hold ``groups`` (usable) and ``dropped`` (why the others were dropped)."""
        super().__init__(groups)
        self.dropped: list[tuple[str, str]] = list(dropped)


def check_groups(
    scored_data: ScoredDataGroup | Sequence[ScoredDataGroup | None] | None,
    group_size: int,
    ensure_scores_are_not_same: bool,
    max_seq_len: int,
    stats: Any,
    drops: Any = None,
) -> CheckedGroups:
    """The one scored-group check of the env side: the usable groups of ``scored_data``.

    Each group is checked with :func:`reject_reason`; each dropped one is logged and counted.
    ``scored_data`` that is already a :class:`CheckedGroups` is returned unchanged (checked
    once, not again). The API checks the shape again on its side.

    Args:
        scored_data: one group, a list of groups (None entries are skipped), or None.
        group_size: expected sequences per group (unless ``group_overrides`` says otherwise).
        ensure_scores_are_not_same: drop groups whose scores are all equal.
        max_seq_len: drop groups with a sequence this long or longer (-1 = no limit).
        stats: counter (``Counter[str]``) that gets ``groups_dropped_<reason>`` += 1 per drop
            (``invalid`` also for non-dict entries).
        drops: a :class:`~atroposlib.envs.drops.DropTally` that counts each dropped group's
            rollouts and tokens for run-api's ledger (None: not counted).
    """
    if isinstance(scored_data, CheckedGroups):
        return scored_data
    groups = [] if scored_data is None else scored_data if isinstance(scored_data, list) else [scored_data]
    checked = CheckedGroups()
    for group in groups:
        if group is None:
            continue
        problem = (
            reject_reason(group, group_size, ensure_scores_are_not_same, max_seq_len)
            if isinstance(group, dict)
            else ("invalid", f"groups must be ScoredDataGroup dicts, got {type(group).__name__}")
        )
        if problem is None:
            checked.append(group)
            continue
        key, message = problem
        checked.dropped.append(problem)
        stats[f"groups_dropped_{key}"] += 1
        if drops is not None:
            drops.add(group, key)
        (logger.debug if key == "same_scores" else logger.warning)("dropping group: %s", message)
    return checked


def normalise_group(
    group: ScoredDataGroup, include_messages: bool, decode: Callable[[list[int]], str]
) -> ScoredDataGroup:
    """Fill ``group`` in place for sending, and return it.

    Every optional key is set (None when absent), scores become floats, and with
    ``include_messages`` a group without ``messages`` gets a one-turn ``user`` transcript of
    ``decode(tokens)`` per sequence.
    """
    for key in OPTIONAL_GROUP_KEYS:
        group.setdefault(key, None)  # type: ignore[misc]
    group["scores"] = [float(s) for s in group["scores"]]
    if include_messages and group.get("messages") is None:
        group["messages"] = [
            [{"role": "user", "content": decode(tokens)}] for tokens in group["tokens"]
        ]
    return group


def completion_lengths(group: ScoredDataGroup) -> list[int]:
    """Trained (unmasked) tokens per sequence: ``[G]``."""
    return [sum(1 for m in masks if m != IGNORE_INDEX) for masks in group["masks"]]




def set_reference_answer(group: ScoredDataGroup, answer: Any) -> ScoredDataGroup:
    """Record ``answer`` as ``group``'s reference answer (``group_overrides["reference_answer"]``).

    ``group_overrides`` is the one group-level field that ``run-api`` keeps and serves, so both
    the ``process`` files and ``view-run`` see it. A string is kept as is; any other value is
    written as JSON text (``7``, ``["a", "b"]``). ``None`` leaves the group unchanged.

    Returns:
        ``group`` (changed in place).
    """
    if answer is None:
        return group
    text = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False, default=str)
    group["group_overrides"] = {**(group.get("group_overrides") or {}), REFERENCE_KEY: text}
    return group


def record_item(group: ScoredDataGroup, item: Item, stats: Any = None) -> ScoredDataGroup:
    """Put ``item`` on ``group`` as its ``item`` field, as JSON, when it fits the wire.

    The value sent is ``item`` after a JSON round trip (tuples become lists, dict keys
    strings), so the scorer gets at rescore time what it would get from the wire. An item that
    is not JSON, holds a number JSON cannot carry, or passes ``MAX_ITEM_BYTES`` (64 KiB) of
    JSON is left off (the group is sent without it), counted in ``stats["items_not_recorded"]``
    and logged once. A group that has an ``item`` already, and a None item, are left alone.

    Returns:
        ``group`` (changed in place).
    """
    if item is None or group.get("item") is not None:
        return group
    try:
        text = json.dumps(item, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        reason = f"it is not JSON ({exc})"
    else:
        value = json.loads(text)
        size = len(text.encode())
        reason = free_json_error(value) or (
            f"it is {size} bytes of JSON, more than {MAX_ITEM_BYTES}" if size > MAX_ITEM_BYTES else "")
        if not reason:
            group["item"] = value
            return group
    if stats is not None:
        stats["items_not_recorded"] += 1
    if stats is None or stats["items_not_recorded"] == 1:
        logger.warning("a group is sent without its item (atropos-replay rescore cannot score it "
                       "again): %s; make the env's items smaller JSON, or set "
                       "--env.record_items false", reason)
    return group


def new_group(with_logprobs: bool = True) -> ScoredDataGroup:
    """An empty group with the per-sequence lists the envs fill."""
    group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
    if with_logprobs:
        group["inference_logprobs"] = []
    return group


def add_rollout(group: ScoredDataGroup, node: Any, score: float, messages: list[Message]) -> None:
    """Append one managed-server sequence (tokens, masks, log-probs) with its score.

    Log-probs at masked (prompt) positions are written as ``MASKED_LOGPROB`` (1.0), as the
    API expects, whatever the server put there.
    """
    group["tokens"].append(list(node.tokens))
    group["masks"].append(list(node.masked_tokens))
    group["inference_logprobs"].append(
        [lp if m != IGNORE_INDEX else MASKED_LOGPROB
         for lp, m in zip(node.logprobs, node.masked_tokens, strict=True)])
    group["scores"].append(float(score))
    group["messages"].append(messages)


__all__ = [
    "REFERENCE_KEY",
    "ITEM_LIST_FIELDS",
    "OPTIONAL_GROUP_KEYS",
    "ScoredDataGroup",
    "ScoredDataItem",
    "CheckedGroups",
    "add_rollout",
    "aggregate_items",
    "check_groups",
    "completion_lengths",
    "gather_rollouts",
    "new_group",
    "normalise_group",
    "record_item",
    "reject_reason",
    "set_reference_answer",
]
