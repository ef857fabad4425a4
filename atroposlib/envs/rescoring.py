"""Scoring a recorded group again, without the policy: what ``BaseEnv.rescore_group`` does per env kind.

``atropos-replay rescore`` calls ``env.rescore_group(item, group)`` on each recorded group that
carries its dataset item (the wire's optional ``item`` field) and compares the result with the
recorded ``scores``. Nothing here calls an inference server. One function per kind of env:

* :func:`rescore_single_turn`: a :class:`~atroposlib.envs.single_turn.SingleTurnEnv` scores each
  member's reply (``reward_for``: ``score(item, completion)`` or ``truncated_reward``; or the
  env's own ``score_group``).
* :func:`rescore_episodes`: a :class:`~atroposlib.envs.multi_turn.MultiTurnEnv` scores each
  member's recorded transcript with its ``score_episode(item, messages)``; an env that only
  knows its reward from live episode state (a tool's or game's state in ``play_episode``) raises
  :class:`RescoreUnsupported` naming that hook.
* :func:`rescore_with_score`: an env in Atropos 0.4's idiom (``collect_trajectories`` builds a
  list of per-member dicts and returns ``await self.score(that_list)``) gets that list rebuilt
  from the record: each member's dict is the item's fields plus ``messages``,
  ``finish_reason``, ``tokens``, ``masks`` and ``logprobs``; ``score``'s answer is matched back
  to the members by their tokens (it may shuffle or drop members).

A member's new score is a float, None when the scorer left the member out, or the exception
the scorer raised for it (reported, not raised).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Sequence
from typing import Any

from atroposlib.envs.scoring import ScoreResult, resolve_score
from atroposlib.errors import AtroposError
from atroposlib.type_definitions import IGNORE_INDEX

#: One member's new score: a float, None (left out by the scorer) or the scorer's exception.
MemberScore = float | None | Exception


class RescoreUnsupported(AtroposError):
    """The env cannot score a recorded group again; the message names the hook to implement."""


def _text(content: Any) -> str:
    """A message's content as text (the text parts of a list of content parts)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def recorded_messages(group: dict[str, Any], i: int) -> list[dict[str, Any]] | None:
    """Member ``i``'s recorded chat messages (a list of role/content dicts), or None."""
    messages = (group.get("messages") or [None] * (i + 1))[i]
    if not isinstance(messages, (list, tuple)) or not messages:
        return None
    return [dict(m) for m in messages if isinstance(m, dict)]


def trained_ids(group: dict[str, Any], i: int) -> list[int]:
    """Member ``i``'s trained token ids (those whose mask is not ``IGNORE_INDEX``)."""
    return [int(t) for t, m in zip(group["tokens"][i], group["masks"][i], strict=True)
            if m != IGNORE_INDEX]


def finish_reason(tokenizer: Any, group: dict[str, Any], i: int) -> str:
    """``"stop"`` when member ``i``'s last trained token is special (an end of turn), else ``"length"``.

    A reply that ends without an end of turn was cut off at the completion budget.
    """
    ids = trained_ids(group, i)
    return "stop" if ids and ids[-1] in set(tokenizer.all_special_ids) else "length"


def reply_text(env: Any, group: dict[str, Any], i: int) -> str:
    """Member ``i``'s reply text.

    Its last assistant message when the group carries messages, else its trained tokens
    decoded with the env's tokenizer (special tokens skipped).
    """
    replies = [m for m in recorded_messages(group, i) or [] if m.get("role") == "assistant"]
    if replies:
        return _text(replies[-1].get("content"))
    return env.tokenizer.decode(trained_ids(group, i), skip_special_tokens=True)


async def rescore_single_turn(env: Any, item: Any, group: dict[str, Any],
                              own_group_scorer: bool) -> list[MemberScore]:
    """A SingleTurnEnv's score of each member's reply (see the module).

    ``own_group_scorer``: the env overrides ``score_group`` (called once with every reply).
    A scorer that raises gives its exception for that member (for every member with
    ``own_group_scorer``).
    """
    n = len(group["tokens"])
    reasons = [finish_reason(env.tokenizer, group, i)
               if env.truncated_reward is not None or own_group_scorer else None for i in range(n)]
    texts = [reply_text(env, group, i) for i in range(n)]
    if own_group_scorer:
        try:
            scored = await env.score_group(item, texts, reasons)
            return [float((await resolve_score(r))[0]) for r in scored]
        except Exception as exc:  # noqa: BLE001 - a scorer's failure is reported, not fatal
            return [exc] * n

    async def one(text: str, reason: str | None) -> MemberScore:
        try:
            return float((await env.reward_for(item, text, reason))[0])
        except Exception as exc:  # noqa: BLE001 - a scorer's failure is reported, not fatal
            return exc

    return list(await asyncio.gather(*(one(t, r) for t, r in zip(texts, reasons, strict=True))))


def live_state_error(name: str) -> RescoreUnsupported:
    """The error of a MultiTurnEnv ``name`` without ``score_episode``: which hook to implement."""
    return RescoreUnsupported(
        f"{name} computes an episode's reward inside play_episode, from live episode state "
        "(a tool's or game's state) that the record does not hold, so it cannot be scored "
        f"again: implement {name}.score_episode(item, messages) -> score (the reward of a "
        "finished transcript; call it from play_episode so training and rescore agree), or "
        f"{name}.rescore_group(item, group) -> list of scores")


async def rescore_episodes(env: Any, item: Any, group: dict[str, Any]) -> list[MemberScore]:
    """A MultiTurnEnv's ``score_episode(item, messages)`` of each member's recorded transcript.

    Raises:
        RescoreUnsupported: the group was sent without its members' messages.
    """
    name = type(env).__name__
    transcripts = [recorded_messages(group, i) for i in range(len(group["tokens"]))]
    if any(t is None for t in transcripts):
        raise RescoreUnsupported(
            f"a group of {name} was sent without its members' messages, which score_episode "
            "needs: record runs with --env.include_messages true (or leave the env's "
            "send_messages on)")

    async def one(messages: list[dict[str, Any]]) -> MemberScore:
        try:
            return float((await resolve_score(env.score_episode(item, messages)))[0])
        except Exception as exc:  # noqa: BLE001 - a scorer's failure is reported, not fatal
            return exc

    return list(await asyncio.gather(*(one(t) for t in transcripts)))  # type: ignore[arg-type]


def _score_inputs(env: Any, item: Any, group: dict[str, Any]) -> list[dict[str, Any]]:
    """Member dicts as Atropos 0.4 envs pass them to ``score`` (see the module)."""
    inputs = []
    fields = dict(item) if isinstance(item, dict) else {"item": item}
    logprobs = group.get("inference_logprobs") or [None] * len(group["tokens"])
    for i, tokens in enumerate(group["tokens"]):
        messages = recorded_messages(group, i)
        if messages is None or not any(m.get("role") == "assistant" for m in messages):
            masks = group["masks"][i]
            prompt = [int(t) for t, m in zip(tokens, masks, strict=True) if m == IGNORE_INDEX]
            messages = [{"role": "user", "content": env.tokenizer.decode(prompt, skip_special_tokens=True)},
                        {"role": "assistant", "content": reply_text(env, group, i)}]
        inputs.append({**fields, "messages": tuple(messages),
                       "finish_reason": finish_reason(env.tokenizer, group, i),
                       "tokens": list(tokens), "masks": list(group["masks"][i]),
                       "logprobs": logprobs[i]})
    return inputs


def _overrides_score(env: Any) -> bool:
    """Whether ``env`` has a ``score(rollout_group_data)`` of its own (Atropos 0.4's idiom)."""
    score = getattr(type(env), "score", None)
    if not callable(score):
        return False
    try:
        params = [p for p in inspect.signature(score).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return False
    return len(params) == 2  # self, rollout_group_data


async def rescore_with_score(env: Any, item: Any, group: dict[str, Any]) -> list[MemberScore]:
    """An Atropos 0.4-style env's ``score(rollout_group_data)`` on the rebuilt member dicts.

    Returns:
        Each member's score in ``score``'s answer, matched by tokens; None for a member the
        answer left out; ``score``'s exception for every member when it raised anything other
        than a missing key.

    Raises:
        RescoreUnsupported: the env has no ``score(rollout_group_data)``, or ``score`` looked up
            a key the rebuilt dicts do not have (it needs what only ``collect_trajectories``
            computed), or returned something that is not a group.
    """
    name = type(env).__name__
    how = (f"implement {name}.rescore_group(item, group) -> list of scores (one per member of "
           "group['tokens'], from the recorded item, messages and tokens)")
    if not _overrides_score(env):
        raise RescoreUnsupported(f"{name} has no scorer rescore knows how to call: {how}")
    try:
        answer = env.score(_score_inputs(env, item, group))
        if inspect.isawaitable(answer):
            answer = await answer
    except KeyError as exc:
        raise RescoreUnsupported(
            f"{name}.score() looked up {exc} in a member, which the record does not hold (rescore "
            "passes the item's fields plus messages, finish_reason, tokens, masks and logprobs); "
            f"{how}") from exc
    except Exception as exc:  # noqa: BLE001 - a scorer's failure is reported, not fatal
        return [exc] * len(group["tokens"])
    if answer is None:
        return [None] * len(group["tokens"])
    if isinstance(answer, Sequence) and not isinstance(answer, dict):
        answer = next((g for g in answer if g), None) if len(answer) == 1 else answer
    if not isinstance(answer, dict) or "tokens" not in answer or "scores" not in answer:
        raise RescoreUnsupported(f"{name}.score() returned {type(answer).__name__}, not one "
                                 f"ScoredDataGroup; {how}")
    by_tokens: dict[tuple[int, ...], list[float]] = {}
    for tokens, score in zip(answer["tokens"], answer["scores"], strict=True):
        by_tokens.setdefault(tuple(int(t) for t in tokens), []).append(float(score))
    out: list[MemberScore] = []
    for tokens in group["tokens"]:
        scores = by_tokens.get(tuple(int(t) for t in tokens))
        out.append(scores.pop(0) if scores else None)
    return out


class RescoreMixin:
    """``BaseEnv.rescore_group``: score a recorded group again (``atropos-replay rescore``)."""

    async def rescore_group(self, item: Any, group: dict[str, Any]) -> list[MemberScore]:
        """The score each member of a recorded ``group`` gets now, with no inference call.

        ``group`` is a group as the trainer received it (``tokens``, ``masks``, ``scores``,
        ``messages`` when sent, ...), ``item`` its dataset item (the wire's ``item`` field).
        Default: Atropos 0.4's idiom, :func:`rescore_with_score` (the env's
        ``score(rollout_group_data)`` on member dicts rebuilt from the record).
        ``SingleTurnEnv`` and ``MultiTurnEnv`` implement it with their scorers; override it
        when your env's scorer needs something else.

        Returns:
            One entry per member of ``group["tokens"]``: the new score (float), None for a
            member the scorer leaves out, or the exception the scorer raised for it.

        Raises:
            RescoreUnsupported: this env cannot score a recorded group (the message names
                the method to implement).
        """
        return await rescore_with_score(self, item, group)


class EpisodeRescoreMixin:
    """``MultiTurnEnv``'s optional ``score_episode`` hook and the ``rescore_group`` it enables."""

    def score_episode(self, item: Any, messages: list[dict[str, Any]]) -> ScoreResult | Awaitable[ScoreResult]:
        """The reward of a finished episode from its transcript alone (optional hook).

        Implement it when an episode's reward follows from ``item`` and the conversation
        (``messages``: opening, assistant and tool/env turns, as recorded on the group) and
        call it from ``play_episode``: ``atropos-replay rescore`` then scores recorded
        episodes again with it (:meth:`rescore_group`). May be async and may return
        ``(score, details)``.

        Raises:
            RescoreUnsupported: not implemented (the reward comes from live episode state).
        """
        raise live_state_error(type(self).__name__)

    async def rescore_group(self, item: Any, group: dict[str, Any]) -> list[MemberScore]:
        """:meth:`score_episode` of each member's recorded transcript (``group["messages"]``).

        Raises:
            RescoreUnsupported: :meth:`score_episode` is not implemented, or the group was
                sent without messages.
        """
        if type(self).score_episode is EpisodeRescoreMixin.score_episode:
            raise live_state_error(type(self).__name__)
        return await rescore_episodes(self, item, group)


__all__ = ["EpisodeRescoreMixin", "MemberScore", "RescoreMixin", "RescoreUnsupported", "live_state_error", "finish_reason", "recorded_messages", "reply_text",
           "rescore_episodes", "rescore_single_turn", "rescore_with_score", "trained_ids"]
