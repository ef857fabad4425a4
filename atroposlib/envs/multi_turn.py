"""``MultiTurnEnv``: ``group_size`` episodes per item, each a conversation of one or more turns.

Subclass it and write :meth:`MultiTurnEnv.play_episode` (usually: opening messages and a
reply handler passed to :meth:`MultiTurnEnv.converse`) and, in ``setup``, the items
(``self.train_items`` / ``self.eval_items``). The items and their cursor (with its checkpoint),
``config_init``, the group, evaluation, the metrics hooks and the train accuracy are done here.
A single-turn env is the case of one turn: :class:`~atroposlib.envs.single_turn.SingleTurnEnv`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.config import default_server
from atroposlib.envs.episodes import Episode, ReplyHandler, run_episode
from atroposlib.envs.groups import add_rollout, new_group
from atroposlib.envs.outcomes import Member, attach_outcomes
from atroposlib.envs.rescoring import EpisodeRescoreMixin
from atroposlib.envs.scoring import mean_details
from atroposlib.type_definitions import Item, Message


class MultiTurnEnvConfig(BaseEnvConfig):
    """``BaseEnvConfig`` plus the sampling settings and the turn limit of an episode env.

    Defaults differ from ``BaseEnvConfig`` where such an env wants them to: groups of 8,
    2048-token sequences, no W&B unless asked (the tokenizer is ``BaseEnvConfig``'s: the bundled
    one unless set). ``max_tokens`` is per assistant turn.
    """

    group_size: int = Field(default=8, ge=1, description="Rollouts (responses) per group.")
    max_token_length: int = Field(default=2048, ge=1, description="Longest sequence, in tokens.")
    use_wandb: bool = Field(default=False, description="Log metrics to Weights & Biases.")
    max_tokens: int = Field(default=256, ge=1, description="Completion budget per rollout.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature (training).")
    eval_temperature: float = Field(default=0.0, ge=0, description="Evaluation temperature (0 = greedy).")
    seed: int = Field(default=0, description="Seed of ``self.rng`` (item generators, shuffles).")
    max_turns: int = Field(
        default=4, ge=1,
        description="Assistant turns per episode at most; an episode also ends early when the "
        "next turn would not fit in max_token_length tokens.",
    )


class MultiTurnEnv(EpisodeRescoreMixin, BaseEnv):
    """An environment of episodes: implement :meth:`play_episode` and ``setup``.

    In ``setup`` fill ``self.train_items`` (a list, cycled with a cursor) or override
    :meth:`train_item` (e.g. a seeded generator using ``self.rng``), and ``self.eval_items``
    (or override :meth:`load_eval_items`).

    A training group is ``group_size`` episodes of the same item, played concurrently; each
    episode's final ``managed_server`` sequence trains every assistant turn
    (:func:`~atroposlib.envs.episodes.run_episode`). ``evaluate`` plays one episode per eval
    item at ``eval_temperature`` (:meth:`sample_eval_items`) and logs :meth:`eval_metrics`
    (``eval/accuracy`` = share of episodes scoring >= 1, ``eval/mean_score``,
    ``eval/stopped_fraction`` of the last turns, ``eval/num_items``, and
    :meth:`details_metrics` of the episodes' details).

    Optional: :meth:`score_episode` (the reward of a finished transcript, which lets
    ``atropos-replay rescore`` score recorded episodes again), :meth:`answer` (reference
    answer, kept in eval samples for the views),
    :meth:`finish_group` (reshape or drop a scored group), :meth:`eval_metrics` /
    :meth:`details_metrics` / :meth:`eval_failure_metrics` (other metrics), and the class
    attributes ``send_messages``, ``config_defaults`` and ``server_defaults`` (overrides of the
    default env and server configs).

    Done for you: ``config_init`` (bundled tokenizer, the dev vLLM server), ``get_next_item``
    (the runners apply the env config's ``item_filter`` to it, the zero-variance rule of
    ``zero_variance_keep`` included), ``collect_trajectories``, ``evaluate``,
    ``train/percent_correct`` in ``wandb_log``, and the cursor (``self.iter``) in checkpoints.
    """

    env_config_cls: type[BaseEnvConfig] = MultiTurnEnvConfig
    #: Send each rollout's chat messages with the group. False: only when the env config's
    #: ``include_messages`` is set (token-only groups, smaller posts; tools decode the tokens).
    send_messages: bool = True
    #: Overrides of :func:`~atroposlib.envs.config.default_server` in ``config_init``.
    server_defaults: Mapping[str, Any] = {}
    #: Overrides of the env config's defaults in ``config_init`` (e.g. ``{"max_turns": 6}``).
    config_defaults: Mapping[str, Any] = {}
    train_items: Sequence[Item] = ()
    eval_items: Sequence[Item] = ()

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        import random

        self.iter = 0
        self.rng = random.Random(getattr(self.config, "seed", 0))
        self.train_correct: list[float] = []
        self.train_scores: list[float] = []
        self.train_details: list[dict[str, Any]] = []

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, list[APIServerConfig]]:
        """Defaults: ``env_config_cls()`` named after the env, the dev vLLM at 127.0.0.1:9100.

        ``config_defaults`` and ``server_defaults`` override fields of the env and server
        configs.
        """
        env_config = cls.env_config_cls(**{"wandb_name": cls.name, **cls.config_defaults})
        return env_config, [default_server(**cls.server_defaults)]

    # ------------------------------------------------------------------ the hooks
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

    def answer(self, item: Item) -> Any:
        """The reference answer of ``item``, kept in eval samples and shown in the rollout views.

        Default: ``item["answer"]`` when the item is a mapping with that key, else None.
        """
        return item.get("answer") if isinstance(item, Mapping) else None

    def load_eval_items(self) -> Sequence[Item]:
        """Eval items loaded on the first ``evaluate`` when ``setup`` left ``eval_items`` empty.

        Override it for data that is costly to load (serve mode may never evaluate);
        default: none.
        """
        return ()

    def finish_group(self, item: Item, group: ScoredDataGroup) -> ScoredDataGroup | None:
        """Reshape a scored group before it is sent (e.g. a length penalty); None drops it.

        Default: the group unchanged. ``group["tokens"]`` and ``group["scores"]`` are
        parallel lists of ``group_size`` entries.
        """
        return group

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Metrics of scored eval samples (each ``{"score", "finish_reason", ...}``).

        Returns:
            ``{"eval/accuracy": share scoring >= 1, "eval/mean_score",
            "eval/stopped_fraction": share not cut off at the budget, "eval/num_items"}``.
            Override and extend ``super().eval_metrics(samples)`` to add metrics.
        """
        n = max(1, len(samples))
        return {
            "eval/accuracy": sum(s["score"] >= 1.0 for s in samples) / n,
            "eval/mean_score": sum(s["score"] for s in samples) / n,
            "eval/stopped_fraction": sum(s["finish_reason"] != "length" for s in samples) / n,
            "eval/num_items": float(len(samples)),
            **self.details_metrics([s.get("details", {}) for s in samples], "eval"),
        }

    def details_metrics(self, details: list[dict[str, Any]], prefix: str) -> dict[str, float]:
        """Metrics of the score details (``prefix`` is ``"train"`` or ``"eval"``).

        Default: the mean of each numeric detail as ``<prefix>/<name>``
        (:func:`~atroposlib.envs.scoring.mean_details`).
        """
        return mean_details(details, prefix)

    def eval_failure_metrics(self, failed: int, total: int) -> dict[str, float]:
        """Metrics of the ``failed`` of ``total`` eval items whose request or scoring raised.

        Default: ``{"eval/failed_items": failed}`` when some failed, else nothing.
        """
        return {"eval/failed_items": float(failed)} if failed else {}

    def train_item(self, index: int) -> Item:
        """The ``index``-th training item; default ``self.train_items`` cycled.

        Raises:
            ValueError: ``self.train_items`` is empty (fill it in ``setup``).
        """
        if not self.train_items:
            raise ValueError(
                f"{type(self).__name__} has no training items: fill self.train_items in setup() "
                "or override train_item(index)"
            )
        return self.train_items[index % len(self.train_items)]

    # ------------------------------------------------------------------ done once, here
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

    async def get_next_item(self) -> Item:
        """The training item at the cursor; advances the cursor.

        Items whose recent groups all scored the same are skipped by the runners' item filter
        (``item_filter``, or ``zero_variance_keep < 1``:
        :mod:`atroposlib.env_runtime.filtering`; ``train/difficulty_skipped`` counts them).
        """
        item = self.train_item(self.iter)
        self.iter += 1
        return item

    def record_group(self, item: Item, group: ScoredDataGroup | None) -> ScoredDataGroup | None:
        """The last step of :meth:`finish_rollouts`; returns the group unchanged.

        The item filter learns from the groups in the runners now; kept for subclasses that
        override or call it.
        """
        return group

    def record_train_score(self, score: float, details: Mapping[str, Any]) -> None:
        """Count one training rollout's score (and details) for the ``train/`` metrics."""
        self.train_correct.append(1.0 if score >= 1.0 else 0.0)
        self.train_scores.append(float(score))
        if details:
            self.train_details.append(dict(details))

    def finish_rollouts(self, item: Item, group: ScoredDataGroup) -> ScoredDataGroup | None:
        """The last steps of every group: messages kept or not, :meth:`finish_group`.

        (The dataset item goes on the group later, on delivery, for every kind of env:
        :func:`~atroposlib.env_runtime.delivery.record_items`.)
        """
        if not (self.send_messages or self.config.include_messages):
            group["messages"] = None
        return self.record_group(item, self.finish_group(item, group))

    async def collect_trajectories(
        self, item: Item
    ) -> tuple[ScoredDataGroup | None, list[Item]]:
        """Play ``group_size`` episodes of ``item`` concurrently; one rollout each.

        Each episode is bounded by ``config.rollout_timeout``; one that raises (inference, the
        env's reply or score) or times out fails alone and is sent in ``excluded``, and
        ``config.failed_rollout_policy`` decides what becomes of the group
        (:meth:`~atroposlib.envs.base.BaseEnv.run_rollouts`).
        """
        temperature = self.config.temperature
        members = await self.run_rollouts(
            lambda _i: self.play_episode(item, temperature=temperature, split="train"),
            self.config.group_size)
        if members is None:
            return None, []
        group = new_group()
        group["generation_params"] = {"temperature": temperature}
        for member in members:
            if member.completed:
                episode, score, details = member.value
                self.record_train_score(score, details)
                add_rollout(group, episode.node, score, episode.messages)
        return self.finish_outcomes(self.finish_rollouts(item, group), members), []

    def finish_outcomes(self, group: ScoredDataGroup | None, members: list[Member]
                        ) -> ScoredDataGroup | None:
        """Write the members' outcomes into a finished group (None stays None)."""
        if group is not None:
            attach_outcomes(group, members, timeout=self.config.rollout_timeout, stats=self.stats)
        return group

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """Score the eval items (:meth:`sample_eval_items`); log and return the metrics.

        Returns:
            :meth:`eval_metrics` of the samples + :meth:`eval_failure_metrics` (by default
            ``"eval/failed_items"`` when some requests or scorings failed; those items are
            not counted as wrong).
        """
        start = time.time()
        if not self.eval_items:
            self.eval_items = list(self.load_eval_items())
        samples, failed = await self.sample_eval_items()
        metrics = self.eval_metrics(samples)
        metrics.update(self.eval_failure_metrics(failed, len(self.eval_items)))
        self.evaluate_log(metrics, start_time=start, samples=samples, generation_parameters={
            "temperature": self.config.eval_temperature, "max_tokens": self.config.max_tokens})
        return metrics

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

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        """Add the training metrics of the rollouts since the last call.

        ``train/percent_correct`` (share scoring >= 1), ``train/mean_score`` and
        :meth:`details_metrics` of the score details.
        """
        metrics = dict(metrics or {})
        if self.train_correct:
            metrics["train/percent_correct"] = sum(self.train_correct) / len(self.train_correct)
            metrics["train/mean_score"] = sum(self.train_scores) / len(self.train_scores)
            metrics.update(self.details_metrics(self.train_details, "train"))
            self.train_correct, self.train_scores, self.train_details = [], [], []
        await super().wandb_log(metrics)

    def save_checkpoint(self, step: int, data: dict[str, Any] | None = None) -> None:
        """Save the cursor (``iter``) with ``data``; ``load_checkpoint`` restores it."""
        super().save_checkpoint(step, {"iter": self.iter, **(data or {})})


__all__ = ["MultiTurnEnv", "MultiTurnEnvConfig"]
