"""``check_env``: drive an environment like a runner does, against a fake server, and assert the group contract."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from atroposlib.api.models import IGNORE_INDEX, MASKED_LOGPROB
from atroposlib.api.shapes import group_shape_error
from atroposlib.env_runtime.step import Skip, run_item

if TYPE_CHECKING:
    from atroposlib.envs.base import BaseEnv, ScoredDataGroup


def check_group(
    group: dict[str, Any], expected_size: int, where: str = "group", tokenizer: Any = None
) -> None:
    """Assert the ``ScoredDataGroup`` invariants on one group.

    Checked: tokens/masks/scores present with ``expected_size`` rows (or
    ``group_overrides["group_size"]``), counting the members in ``excluded``; every per-token field (masks, inference_logprobs,
    advantages, ref_logprobs) has the row's length; ``masks[i][t]`` is ``-100`` or equals
    ``tokens[i][t]``; at least one trained position per sequence; ``inference_logprobs`` is
    ``1.0`` at masked positions and a finite value <= 0 elsewhere; scores are finite;
    ``messages``/``overrides`` have one entry per sequence; token ids fit the vocabulary.

    Args:
        group: the group to check.
        expected_size: sequences expected (config ``group_size``).
        where: label used in messages.
        tokenizer: when given, token ids must be < ``len(tokenizer)``.

    Raises:
        AssertionError: with a message naming the field, the row and how to fix it.
    """
    assert isinstance(group, dict), f"{where}: expected a ScoredDataGroup dict, got {type(group).__name__}"
    for key in ("tokens", "masks", "scores"):
        assert group.get(key) is not None, f"{where}: missing {key!r}; every group needs tokens, masks and scores"
    problem = group_shape_error(group)
    assert problem is None, f"{where}: {problem}"
    size = int((group.get("group_overrides") or {}).get("group_size", expected_size))
    n = len(group["tokens"])
    excluded = len(group.get("excluded") or ())
    assert n + excluded == size, (
        f"{where}: has {n} sequences" + (f" and {excluded} excluded members" if excluded else "")
        + f" but group_size is {size}; return group_size rollouts or set "
        "group_overrides['group_size']"
    )
    vocab = len(tokenizer) if tokenizer is not None else None
    for i in range(n):
        tokens, masks = group["tokens"][i], group["masks"][i]
        assert all(isinstance(t, int) for t in tokens), f"{where}: tokens[{i}] must be ints"
        if vocab is not None:
            bad = [t for t in tokens if not 0 <= t < vocab]
            assert not bad, f"{where}: tokens[{i}] has ids outside the vocabulary (size {vocab}): {bad[:5]}"
        for t, (tok, mask) in enumerate(zip(tokens, masks, strict=True)):
            assert mask in (IGNORE_INDEX, tok), (
                f"{where}: masks[{i}][{t}] is {mask}; a mask holds -100 (not trained) or the token "
                f"id itself ({tok}), it is a label vector, not 0/1"
            )
        assert any(m != IGNORE_INDEX for m in masks), (
            f"{where}: masks[{i}] trains on no token (all -100); mask only the prompt"
        )
        score = group["scores"][i]
        assert isinstance(score, (int, float)) and math.isfinite(score), (
            f"{where}: scores[{i}] = {score!r} is not a finite number"
        )
    sampler_logprobs = group.get("inference_logprobs")
    if sampler_logprobs is not None:
        for i in range(n):
            for t, (lp, mask) in enumerate(zip(sampler_logprobs[i], group["masks"][i], strict=True)):
                if mask == IGNORE_INDEX:
                    assert lp == MASKED_LOGPROB, (
                        f"{where}: inference_logprobs[{i}][{t}] = {lp} at a masked position; use "
                        "1.0 there (managed_server does this)"
                    )
                else:
                    assert math.isfinite(lp) and lp <= 0, (
                        f"{where}: inference_logprobs[{i}][{t}] = {lp} at a trained position; "
                        "it must be the sampler's log-prob (finite, <= 0)"
                    )


async def check_env(
    env_cls: type[BaseEnv],
    server: Any = None,
    config_overrides: dict[str, Any] | None = None,
    num_groups: int = 1,
    max_items: int | None = None,
    tokenizer: Any = None,
) -> list[ScoredDataGroup]:
    """Drive ``setup -> get_next_item -> collect_trajectories`` and assert the group contract.

    First the env's source is read for scoring code that scores 0 inside an ``except`` block
    (a :class:`~atroposlib.env_runtime.score_lint.ZeroScoreOnErrorWarning` per place found).

    Args:
        env_cls: the environment class.
        server: an ``InferenceClient`` (typically ``FakeServer``) or a list of them; default a
            ``FakeServer()`` with a fixed reply.
        config_overrides: env config fields to change (e.g. ``{"tokenizer_name": dir}``).
        num_groups: how many valid groups to collect.
        max_items: give up after this many items (default ``10 * num_groups``).
        tokenizer: use this tokenizer instead of loading ``config.tokenizer_name``.

    Returns:
        The groups collected (after ``postprocess_histories``), each checked by
        :func:`check_group`.

    Raises:
        AssertionError: an invariant is violated, ``collect_trajectories`` raised or returned
            the wrong shape, a rollout failed in the env's own code (kind ``env_error``), or no
            group was produced within ``max_items`` items.
    """
    from atroposlib.env_runtime.score_lint import warn_zero_scores
    from atroposlib.testing.fake_server import FakeServer

    warn_zero_scores(env_cls)
    env_config, _ = env_cls.config_init()
    values = {**env_config.model_dump(), "use_wandb": False, **(config_overrides or {})}
    config = env_cls.env_config_cls(**values)
    servers = server if isinstance(server, list) else [server or FakeServer()]
    env = env_cls(config, servers)
    if tokenizer is not None:
        env.tokenizer = tokenizer
    await env.setup()
    groups: list[ScoredDataGroup] = []
    max_items = max_items if max_items is not None else 10 * num_groups
    tried = 0
    try:
        while len(groups) < num_groups:
            assert tried < max_items, (
                f"{env_cls.__name__}: no valid group after {tried} items (got {len(groups)} of "
                f"{num_groups}); collect_trajectories kept returning None"
            )
            tried += 1
            item = await env.get_next_item()
            assert item is not None, f"{env_cls.__name__}.get_next_item() returned None after setup()"
            # The same step the runners take; check_group below is stricter than its checks.
            outcome = await run_item(env, item, validate=False)
            if outcome.reason in (Skip.ERROR, Skip.INFERENCE, Skip.TIMEOUT):
                exc = outcome.error
                raise AssertionError(
                    f"{env_cls.__name__}.collect_trajectories raised {type(exc).__name__}: {exc}"
                ) from exc
            batch = outcome.groups
            for k, group in enumerate(batch):
                if group is None:
                    continue
                check_group(
                    group,
                    env.config.group_size,
                    where=f"{env_cls.__name__} group {len(groups)}" + (f"[{k}]" if len(batch) > 1 else ""),
                    tokenizer=env._tokenizer,
                )
                broken = [m for m in group.get("excluded") or ()
                          if m.get("outcome") == "failed" and m.get("kind") == "env_error"]
                assert not broken, (
                    f"{env_cls.__name__}: {len(broken)} rollout(s) of a group raised in the env's "
                    f"own code (sent as failed, kind env_error): {broken[0].get('message')}")
                groups.append(group)
    finally:
        await env.server.aclose()
    return groups


__all__ = ["check_env", "check_group"]
