"""``SingleTurnEnv``: the one-turn case of ``MultiTurnEnv``: a prompt, a reply, its score.

Subclass it and write three things: the prompt of an item (:meth:`SingleTurnEnv.prompt`), the
score of a reply (:meth:`SingleTurnEnv.score`, plain or ``async``) and, in ``setup``, the items
(``self.train_items`` / ``self.eval_items``). Everything else is
:class:`~atroposlib.envs.multi_turn.MultiTurnEnv`'s (items, cursor, config defaults, metrics,
checkpoints); an episode here is one turn, and a group's ``group_size`` replies are sampled in
one request (an ``n``-way chat call through ``managed_server``, exact tokens and sampler
log-probs) instead of ``group_size`` separate episodes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, Literal

from pydantic import Field

from atroposlib.api.models import IGNORE_INDEX
from atroposlib.envs.base import BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.episodes import Episode, run_episode
from atroposlib.envs.eval import eval_samples
from atroposlib.envs.groups import add_rollout, new_group, set_reference_answer
from atroposlib.envs.multi_turn import MultiTurnEnv, MultiTurnEnvConfig
from atroposlib.envs.outcomes import Member, masked_entry, new_rollout_ids
from atroposlib.envs.rescoring import MemberScore, rescore_single_turn
from atroposlib.envs.scoring import ScoreResult, resolve_score
from atroposlib.errors import RolloutTimeoutError
from atroposlib.inference.clients.base import actual_token_logprob
from atroposlib.type_definitions import Item, Message


class SingleTurnEnvConfig(MultiTurnEnvConfig):
    """``MultiTurnEnvConfig`` for episodes of one turn, with 1024-token sequences."""

    max_token_length: int = Field(default=1024, ge=1, description="Longest sequence, in tokens.")
    max_turns: Literal[1] = Field(default=1, description="Assistant turns per episode: one.")


class SingleTurnEnv(MultiTurnEnv):
    """A single-turn environment: implement :meth:`prompt`, :meth:`score`, and ``setup``.

    In ``setup`` fill ``self.train_items`` (a list, cycled with a cursor) or override
    :meth:`train_item` (e.g. a seeded generator using ``self.rng``), and ``self.eval_items``.
    :meth:`score` may be a coroutine function (``async def``: a judge model call, sandboxed
    code execution); the replies of a group are then scored concurrently. It may return
    ``(score, details)``: numeric details are averaged into ``train/<name>`` and
    ``eval/<name>`` metrics, and all of them are kept in eval samples.
    Optional: :meth:`answer` (reference answer, kept in eval samples for the views),
    :meth:`max_tokens_for` (a completion budget per prompt), :meth:`score_group` (score the
    replies together, e.g. pairwise), :meth:`finish_group` (reshape or drop a scored group),
    :meth:`eval_metrics` / :meth:`details_metrics` / :meth:`eval_failure_metrics` (other
    metrics), and the class
    attributes ``truncated_reward`` (the reward of a reply cut off at ``max_tokens``, instead
    of calling :meth:`score`; None = score it like any reply), ``min_completion_tokens``
    (a group with a shorter reply is dropped), ``config_defaults`` and ``server_defaults``
    (overrides of the default env and server configs).

    Done for you: ``config_init`` (bundled tokenizer, the dev vLLM server), ``get_next_item``,
    ``collect_trajectories`` (``group_size`` replies in one chat call, exact tokens and
    log-probs), ``evaluate`` (one reply per eval item at ``eval_temperature``; logs
    ``eval/accuracy`` = share of replies scoring >= 1, ``eval/mean_score``,
    ``eval/stopped_fraction``, ``eval/num_items``), ``train/percent_correct`` in
    ``wandb_log``, and the cursor (``self.iter``) in checkpoints.
    """

    env_config_cls: type[BaseEnvConfig] = SingleTurnEnvConfig
    #: Reward of a reply that hit ``max_tokens`` (None: call ``score`` on it like any reply).
    truncated_reward: float | None = None
    #: Replies with fewer generated tokens are not scored, and their group is dropped
    #: (it would be short of ``group_size``); 0 = keep every reply.
    min_completion_tokens: int = 0
    #: Opt in to masking replies cut off at ``max_tokens``: they are not scored and travel in
    #: the group's ``excluded`` list (outcome ``masked``, reason ``truncated``), kept for
    #: inspection and never trained on. False (the default) scores them like any reply (or
    #: gives them ``truncated_reward``).
    mask_truncated: bool = False

    # ------------------------------------------------------------------ the hooks
    def prompt(self, item: Item) -> list[Message]:
        """The chat messages sent for ``item``.

        Raises:
            NotImplementedError: the subclass did not implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement prompt(item)")

    def score(self, item: Item, completion: str) -> ScoreResult | Awaitable[ScoreResult]:
        """The reward of reply text ``completion`` to ``item`` (1.0 = fully correct).

        Write it as a plain method or as ``async def`` (it is awaited when it returns an
        awaitable). Return a number, or ``(number, details)`` with ``details`` a dict of
        name -> value (numbers are averaged into metrics; every value must be JSON-able, as
        it is kept in eval samples). An exception raised here drops the training group, and
        in ``evaluate`` counts the item as failed, not as 0.

        Raises:
            NotImplementedError: the subclass did not implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement score(item, completion)")

    def max_tokens_for(self, messages: list[Message]) -> int:
        """The completion budget (tokens) for a prompt; default ``config.max_tokens``.

        Used for training groups and evaluation replies alike.
        """
        return int(self.config.max_tokens)

    async def score_group(
        self, item: Item, completions: list[str], finish_reasons: list[str | None]
    ) -> list[ScoreResult]:
        """The rewards of a group's replies (parallel lists), e.g. for a pairwise judge.

        Default: :meth:`score` of each reply, concurrently (a reply cut off at the budget gets
        ``truncated_reward`` when that is set). Used for training groups; ``evaluate`` scores
        its single replies with :meth:`score`.
        """
        return list(await asyncio.gather(*(
            self.reward_for(item, text, reason)
            for text, reason in zip(completions, finish_reasons, strict=True))))

    async def rescore_group(self, item: Item, group: ScoredDataGroup) -> list[MemberScore]:
        """Each recorded reply scored again as in training.

        :meth:`reward_for` of each reply, or :meth:`score_group` when overridden
        (:func:`~atroposlib.envs.rescoring.rescore_single_turn`).
        """
        own = type(self).score_group is not SingleTurnEnv.score_group
        return await rescore_single_turn(self, item, group, own)

    # ------------------------------------------------------------------ done once, here
    async def reward_for(
        self, item: Item, text: str, finish_reason: str | None
    ) -> tuple[float, dict[str, Any]]:
        """``(score, details)`` of one reply.

        ``truncated_reward`` when the reply was cut off at the budget and that is set, else
        :meth:`score` (awaited when it returns an awaitable).
        """
        if finish_reason == "length" and self.truncated_reward is not None:
            return float(self.truncated_reward), {}
        return await resolve_score(self.score(item, text))

    def item_features(self, item: Item) -> Mapping[str, float] | None:
        """Features of ``item`` for the item filter's free screen: those of its prompt's text.

        :func:`~atroposlib.envs.item_features.text_features` of the :meth:`prompt` messages'
        contents (the reference answer is not read). See
        :meth:`~atroposlib.envs.base.BaseEnv.item_features`.
        """
        from atroposlib.envs.item_features import item_text, text_features

        return text_features(item_text(self.prompt(item)))

    def reference_reply(self, item: Item) -> tuple[str, str] | None:
        """The reply of a policy that solves ``item``, as ``(working, answer)``.

        :meth:`answer_logprob` scores the answer's tokens after the working. Default:
        ``("", str(answer(item)))``, the bare reference answer; None when the item has none.
        Override it to write the working the way the policy does (the arithmetic env: ``"57 +
        12 ="`` then ``" 69"``), so the signal measures the answer, not the reply's format.
        """
        answer = self.answer(item)
        return None if answer is None else ("", str(answer))

    async def answer_logprob(self, item: Item) -> float | None:
        """The policy's log-probability (nats, <= 0) of the reference answer to ``item``.

        The reply :meth:`reference_reply` gives is appended to the prompt (rendered and
        tokenized as training groups are: chat template with the generation prompt, no added
        special tokens) and the log-probs of the answer's tokens and the template's end of turn
        under the serving policy are summed, given the prompt and the working before the answer.
        One prompt-scoring request to the inference server (vLLM's ``prompt_logprobs``), no
        sampling: the item filter's screen uses it to predict how often a group would
        solve the item (``--env.item_filter.screen``).

        Returns:
            The summed log-probability, or None when the item has no reference reply or the
            template does not render it as an extension of the prompt.

        Raises:
            InferenceError: the server returned no prompt log-probs (not a vLLM server).
        """
        reference = self.reference_reply(item)
        if reference is None:
            return None
        tokens = _reply_tokens(self.tokenizer, self.prompt(item), *reference)
        if tokens is None:
            return None
        prompt_ids, reply_ids, answer_start = tokens
        ids = prompt_ids + reply_ids
        result = await self.server.get_logprobs(input_ids=ids, top_k=1)
        total = 0.0
        for position in range(len(prompt_ids) + answer_start, len(ids)):
            logprob = actual_token_logprob(result, position, ids[position])
            if logprob is None:
                return None
            total += logprob
        return total

    async def play_episode(
        self, item: Item, *, temperature: float, split: str
    ) -> tuple[Episode, float, Mapping[str, Any]]:
        """The one-turn episode of ``item``: :meth:`prompt`, one reply, :meth:`reward_for` it.

        A training group samples its ``group_size`` replies in one request instead
        (:meth:`collect_trajectories`); this is the episode a caller of the multi-turn
        interface gets.
        """
        messages = self.prompt(item)
        episode = await run_episode(
            self.server, self.tokenizer, messages, lambda _text, _turn: None, max_turns=1,
            max_tokens=self.max_tokens_for(messages), temperature=temperature, split=split,
        )
        score, details = await self.reward_for(
            item, episode.messages[-1]["content"], episode.finish_reasons[-1])
        return episode, score, details

    async def collect_trajectories(
        self, item: Item
    ) -> tuple[ScoredDataGroup | None, list[Item]]:
        """Sample ``group_size`` replies in one ``managed_server`` chat call and score them.

        Returns ``(None, [])`` (the group is dropped) when a reply is shorter than
        ``min_completion_tokens`` or :meth:`finish_group` returns None. The sampling call is
        bounded by ``config.rollout_timeout`` (past it the group fails with
        :class:`~atroposlib.errors.RolloutTimeoutError`: runners drop it without pausing
        inference); with the default :meth:`score_group` a scorer
        that raises fails only its reply (sent in ``excluded``, no score) and
        ``config.failed_rollout_policy`` decides the group; with ``mask_truncated`` replies cut
        off at the budget are masked.
        """
        messages = self.prompt(item)
        temperature = self.config.temperature
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            bound = asyncio.timeout(self.config.rollout_timeout)
            try:
                async with bound:
                    completion = await managed.chat_completion(
                        messages=messages, n=self.config.group_size,
                        max_tokens=self.max_tokens_for(messages), temperature=temperature)
            except TimeoutError as exc:  # our limit, not the client's: a slow group, no outage
                if not bound.expired():
                    raise
                raise RolloutTimeoutError(f"sampling the group ran past rollout_timeout="
                                          f"{self.config.rollout_timeout:g} s") from exc
            nodes = managed.get_state()["nodes"]
        ids = new_rollout_ids(len(nodes))
        kept, masked = [], []
        for rid, choice, node in zip(ids, completion.choices, nodes, strict=True):
            generated = sum(1 for m in node.masked_tokens if m != IGNORE_INDEX)
            self.completion_lengths.append(generated)
            if self.mask_truncated and choice.finish_reason == "length":
                masked.append(masked_entry(rid, 0, "truncated", tokens=list(node.tokens),
                                           masks=list(node.masked_tokens),
                                           message="cut off at the completion budget"))
            elif generated >= self.min_completion_tokens:
                kept.append((rid, choice.message.content or "", choice.finish_reason, node))
        members = await self._score_members(item, kept)
        if members is None:
            return None, []
        group = new_group()
        group["generation_params"] = {"temperature": temperature}
        for member, (_, text, _, node) in zip(members, kept, strict=True):
            if member.completed:
                score, details = member.value
                self.record_train_score(score, details)
                add_rollout(group, node, score, messages + [{"role": "assistant", "content": text}])
        if len(kept) + len(masked) < len(nodes):  # a reply under min_completion_tokens
            return None, []
        if masked:
            group["excluded"] = masked
            self.stats["members_masked_truncated"] += len(masked)
        if not group["tokens"]:
            self.stats["groups_dropped_all_masked"] += 1
            return None, []
        set_reference_answer(group, self.answer(item))
        return self.finish_outcomes(self.finish_rollouts(item, group), members), []

    async def _score_members(self, item: Item, kept: list[tuple[str, str, Any, Any]]
                             ) -> list[Member] | None:
        """Score the kept replies ``(rollout_id, text, finish_reason, node)`` as group members.

        With the default :meth:`score_group`, each reply is scored on its own under the
        config's outcome settings (a scorer that raises or passes ``rollout_timeout`` fails
        only that member; :meth:`~atroposlib.envs.base.BaseEnv.run_rollouts`); an overridden
        :meth:`score_group` scores them together, and its exception drops the group.
        """
        texts, reasons = [k[1] for k in kept], [k[2] for k in kept]
        if not kept:
            return []
        if type(self).score_group is not SingleTurnEnv.score_group:
            scored = await self.score_group(item, texts, reasons)
            members = [Member(k[0]) for k in kept]
            for member, result in zip(members, scored, strict=True):
                member.value = await resolve_score(result)
            return members
        return await self.run_rollouts(
            lambda i: self.reward_for(item, texts[i], reasons[i]), len(kept),
            ids=[k[0] for k in kept])

    async def sample_eval_items(self) -> tuple[list[dict[str, Any]], int]:
        """One reply per eval item at ``eval_temperature``, scored.

        Returns:
            ``(samples, failed item count)`` (:func:`~atroposlib.envs.eval.eval_samples`).
        """
        return await eval_samples(
            self, list(self.eval_items), self.prompt, self.reward_for,
            max_tokens=self.max_tokens_for, temperature=self.config.eval_temperature,
            answer_fn=self.answer,
        )


def _reply_tokens(tokenizer: Any, messages: list[Message], working: str, answer: str
                  ) -> tuple[list[int], list[int], int] | None:
    """``(prompt token ids, reply token ids, where the answer starts in the reply)``.

    The reply is ``working + answer``; its tokens run up to and including the template's end of
    turn (its first special token). None when the template does not render the conversation
    with the reply as an extension of the prompt with the generation prompt, or when the
    working's own tokens are not the start of the reply's (a token spans the boundary).
    """
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(
        [*messages, {"role": "assistant", "content": working + answer}], tokenize=False)
    if not full.startswith(prompt) or len(full) == len(prompt):
        return None
    reply_ids = list(tokenizer.encode(full[len(prompt):], add_special_tokens=False))
    special = set(tokenizer.all_special_ids)
    for index, token in enumerate(reply_ids):
        if token in special:
            reply_ids = reply_ids[:index + 1]
            break
    working_ids = list(tokenizer.encode(working, add_special_tokens=False)) if working else []
    if reply_ids[:len(working_ids)] != working_ids or len(working_ids) >= len(reply_ids):
        return None
    return list(tokenizer.encode(prompt, add_special_tokens=False)), reply_ids, len(working_ids)


__all__ = ["SingleTurnEnv", "SingleTurnEnvConfig"]
