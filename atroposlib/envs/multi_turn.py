"""``MultiTurnEnv``: ``group_size`` multi-turn episodes per item (tool loops, text games).

Subclass it and write :meth:`MultiTurnEnv.play_episode` (usually: opening messages and a
reply handler passed to :meth:`MultiTurnEnv.converse`) and, in ``setup``, the items. The
items, the cursor and its checkpoint, ``config_init``, the metrics hooks and the train
accuracy are :class:`~atroposlib.envs.single_turn.SingleTurnEnv`'s; the group and
evaluation play whole episodes instead of sampling single replies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from atroposlib.envs.base import BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.episodes import Episode, ReplyHandler, run_episode
from atroposlib.envs.groups import add_rollout, new_group
from atroposlib.envs.single_turn import SingleTurnEnv, SingleTurnEnvConfig
from atroposlib.type_definitions import Item, Message


class MultiTurnEnvConfig(SingleTurnEnvConfig):
    """``SingleTurnEnvConfig`` plus the turn limit; ``max_tokens`` is per assistant turn."""

    max_turns: int = Field(
        default=4, ge=1,
        description="Assistant turns per episode at most; an episode also ends early when the "
        "next turn would not fit in max_token_length tokens.",
    )
    max_token_length: int = Field(default=2048, ge=1, description="Longest sequence, in tokens.")


class MultiTurnEnv(SingleTurnEnv):
    """A multi-turn environment: implement :meth:`play_episode` and ``setup``.

    A training group is ``group_size`` episodes of the same item, played concurrently; each
    episode's final ``managed_server`` sequence trains every assistant turn
    (:func:`~atroposlib.envs.episodes.run_episode`). ``evaluate`` plays one episode per eval
    item at ``eval_temperature`` (:meth:`sample_eval_items`) and logs :meth:`eval_metrics` (``eval/accuracy`` = share of
    episodes scoring >= 1, ``eval/mean_score``, ``eval/stopped_fraction`` of the last turns,
    ``eval/num_items``, and :meth:`details_metrics` of the episodes' details).
    ``prompt`` and ``score`` are not used.
    """

    env_config_cls: type[BaseEnvConfig] = MultiTurnEnvConfig

    async def play_episode(
        self, item: Item, *, temperature: float, split: str
    ) -> tuple[Episode, float, Mapping[str, Any]]:
        """Play one episode of ``item``; return ``(episode, score, details)``.

        ``details`` (name -> number) become ``train/`` and ``eval/`` metrics through
        :meth:`details_metrics`. ``split`` is ``"train"`` or ``"eval"`` (pass it on to
        :meth:`converse`).

        Raises:
            NotImplementedError: the subclass did not implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement play_episode(item, ...)")

    async def converse(
        self, messages: list[Message], on_reply: ReplyHandler, *, temperature: float, split: str
    ) -> Episode:
        """Play a conversation from ``messages`` (:func:`~atroposlib.envs.episodes.run_episode`).

        Uses the config's ``max_turns``, ``max_tokens`` (per turn) and ``max_seq_len``
        (the context limit).
        """
        c = self.config
        return await run_episode(
            self.server, self.tokenizer, messages, on_reply, max_turns=c.max_turns,
            max_tokens=c.max_tokens, temperature=temperature, split=split,
            max_seq_len=c.max_seq_len,
        )

    async def collect_trajectories(
        self, item: Item
    ) -> tuple[ScoredDataGroup | None, list[Item]]:
        """Play ``group_size`` episodes of ``item`` concurrently; one rollout each."""
        temperature = self.config.temperature
        results = await asyncio.gather(*(
            self.play_episode(item, temperature=temperature, split="train")
            for _ in range(self.config.group_size)))
        group = new_group()
        group["generation_params"] = {"temperature": temperature}
        for episode, score, details in results:
            self.train_correct.append(1.0 if score >= 1.0 else 0.0)
            self.train_scores.append(float(score))
            self.train_details.append(dict(details))
            add_rollout(group, episode.node, score, episode.messages)
        if not (self.send_messages or self.config.include_messages):
            group["messages"] = None
        return self.record_group(item, self.finish_group(item, group)), []

    async def sample_eval_items(self) -> tuple[list[dict[str, Any]], int]:
        """One episode per eval item at ``eval_temperature``.

        Returns:
            ``(samples, failed item count)``: an episode that raised is counted, not scored;
            a sample is ``{"item", "messages", "score", "finish_reason" (of the last turn),
            "details", "answer"}``.
        """
        from atroposlib.envs.eval import evaluate_items

        temperature = self.config.eval_temperature

        async def one(item: Item) -> dict[str, Any]:
            episode, score, details = await self.play_episode(
                item, temperature=temperature, split="eval")
            return {"item": item, "messages": episode.messages, "score": float(score),
                    "finish_reason": episode.finish_reasons[-1] if episode.finish_reasons else None,
                    "details": dict(details), "answer": self.answer(item)}

        return await evaluate_items(self.eval_items, one, int(self.config.max_eval_workers))


__all__ = ["MultiTurnEnv", "MultiTurnEnvConfig"]
