"""Shape checks of scored groups: whether a group's rows agree, as plain functions on lists.

Used by the wire model (:class:`~atroposlib.api.models.ScoredData`) and by the env side's group
checks, so both share one definition of a well-formed group. Shape notation as in
:mod:`atroposlib.api.models`.
"""

from __future__ import annotations

import math
from typing import Any

#: Optional fields with one entry per token of each sequence.
PER_TOKEN_FIELDS = ("advantages", "ref_logprobs", "inference_logprobs")


def outcome_shape_error(rollout_ids: list[str] | None, attempts: list[int] | None,
                        excluded: list[Any] | None, n: int) -> str | None:
    """Why a group's outcome fields disagree with its ``n`` kept members, or None.

    ``rollout_ids`` and ``attempts`` (each ``[G]`` or None) have one entry per kept member, and
    every rollout id (kept or excluded) appears once in the group.
    """
    for name, rows in (("rollout_ids", rollout_ids), ("attempts", attempts)):
        if rows is not None and len(rows) != n:
            return (f"{name} has {len(rows)} entries but tokens has {n}; send one per kept "
                    "(completed) member, and put masked or failed members in excluded")
    ids = list(rollout_ids or ()) + [m.rollout_id for m in excluded or ()]
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        twice = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        return (f"rollout id {twice!r} appears twice in the group; every member (kept or "
                "excluded) needs its own rollout id")
    return None


def group_shape_error(group: dict[str, Any]) -> str | None:
    """Return why a scored group would corrupt a batch, or None when its shapes agree.

    Args:
        group: a dict with at least ``tokens``, ``masks`` and ``scores`` (other fields optional).

    Returns:
        A human-readable message naming the field and how to fix it, or None.
    """
    tokens, masks, scores = group["tokens"], group["masks"], group["scores"]
    n = len(tokens)
    if n == 0:
        return "tokens is empty: a group needs at least one sequence"
    if len(masks) != n or len(scores) != n:
        return (
            f"tokens, masks and scores must have one row per sequence; got {n} tokens rows, "
            f"{len(masks)} masks rows and {len(scores)} scores"
        )
    for i in range(n):
        if len(masks[i]) != len(tokens[i]):
            return f"masks[{i}] has {len(masks[i])} entries but tokens[{i}] has {len(tokens[i])}"
        if not math.isfinite(scores[i]):  # the wire model already refuses these
            return f"scores[{i}] is {scores[i]}: scores must be finite numbers"
    for name in PER_TOKEN_FIELDS:
        rows = group.get(name)
        if rows is None:
            continue
        if len(rows) != n:
            return f"{name} has {len(rows)} rows but tokens has {n}; send one row per sequence"
        for i in range(n):
            if len(rows[i]) != len(tokens[i]) and not (
                name == "advantages" and len(rows[i]) > len(tokens[i])  # cut by ScoredData
            ):
                return (
                    f"{name}[{i}] has {len(rows[i])} entries but tokens[{i}] has "
                    f"{len(tokens[i])}; per-token fields must match the sequence length"
                )
    for name in ("overrides", "messages"):
        rows = group.get(name)
        if rows is not None and len(rows) not in (0, n):
            return f"{name} has {len(rows)} entries but the group has {n} sequences"
    return _distill_shape_error(group, tokens)


def _distill_shape_error(group: dict[str, Any], tokens: list[list[int]]) -> str | None:
    """Why ``distill_token_ids`` / ``distill_logprobs`` do not line up with ``tokens``, or None."""
    ids, lps = group.get("distill_token_ids"), group.get("distill_logprobs")
    if ids is None and lps is None:
        return None
    if ids is None or lps is None:
        return ("distill_token_ids and distill_logprobs go together: send both (teacher top-k ids "
                "and their log-probs) or neither")
    n = len(tokens)
    for name, rows in (("distill_token_ids", ids), ("distill_logprobs", lps)):
        if len(rows) != n:
            return f"{name} has {len(rows)} rows but tokens has {n}; send one row per sequence"
    for i in range(n):
        if len(ids[i]) != len(tokens[i]) or len(lps[i]) != len(tokens[i]):
            return (f"distill_token_ids[{i}] / distill_logprobs[{i}] have {len(ids[i])} / "
                    f"{len(lps[i])} positions but tokens[{i}] has {len(tokens[i])}; the teacher "
                    "arrays are per token (position t holds the candidates for token t)")
        for t, (pos_ids, pos_lps) in enumerate(zip(ids[i], lps[i], strict=True)):
            if len(pos_ids) != len(pos_lps):
                return (f"distill_token_ids[{i}][{t}] has {len(pos_ids)} candidates but "
                        f"distill_logprobs[{i}][{t}] has {len(pos_lps)}; pair each id with its "
                        "log-prob")
    return None
