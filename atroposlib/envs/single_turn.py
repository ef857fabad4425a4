"""``SingleTurnEnv``: one prompt, ``group_size`` sampled replies, a score per reply.

Subclass it and write three things: the prompt of an item (:meth:`SingleTurnEnv.prompt`), the
score of a reply (:meth:`SingleTurnEnv.score`, plain or ``async``) and, in ``setup``, the items
(``self.train_items`` / ``self.eval_items``). Sampling through ``managed_server`` (exact tokens
and sampler log-probs), the group, evaluation, train accuracy and checkpoints are done here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from pydantic import Field

from atroposlib.api.models import IGNORE_INDEX
from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.config import default_server
from atroposlib.envs.eval import eval_samples
from atroposlib.envs.groups import add_rollout, new_group, set_reference_answer
from atroposlib.envs.prompt_filter import ZeroVarianceFilter
from atroposlib.envs.scoring import ScoreResult, mean_details, resolve_score
from atroposlib.type_definitions import Item, Message


class SingleTurnEnvConfig(BaseEnvConfig):
    """``BaseEnvConfig`` plus the sampling settings of a single-turn env.

    Defaults differ from ``BaseEnvConfig`` where a single-turn env wants them to: groups of 8,
    1024-token sequences, no W&B unless asked (the tokenizer is ``BaseEnvConfig``'s: the bundled
    one unless set).
    """

    group_size: int = Field(default=8, ge=1, description="Rollouts (responses) per group.")
    max_token_length: int = Field(default=1024, ge=1, description="Longest sequence, in tokens.")
    use_wandb: bool = Field(default=False, description="Log metrics to Weights & Biases.")
    max_tokens: int = Field(default=256, ge=1, description="Completion budget per rollout.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature (training).")
    eval_temperature: float = Field(default=0.0, ge=0, description="Evaluation temperature (0 = greedy).")
    seed: int = Field(default=0, description="Seed of ``self.rng`` (item generators, shuffles).")
    zero_variance_keep: float = Field(
        default=1.0, gt=0, le=1,
        description="Skip items whose recent groups all scored the same, before sampling them: "
        "an item whose last k groups had zero variance is sampled with probability "
        "zero_variance_keep**k (k <= 4), as in GRESO (arXiv:2506.02177). 1.0 = off.",
    )


class SingleTurnEnv(BaseEnv):
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
    #: Send each rollout's chat messages with the group. False: only when the env config's
    #: ``include_messages`` is set (token-only groups, smaller posts; tools decode the tokens).
    send_messages: bool = True
    #: Replies with fewer generated tokens are not scored, and their group is dropped
    #: (it would be short of ``group_size``); 0 = keep every reply.
    min_completion_tokens: int = 0
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
        keep = float(getattr(self.config, "zero_variance_keep", 1.0))
        self.item_filter = ZeroVarianceFilter(keep) if keep < 1.0 else None

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, list[APIServerConfig]]:
        """Defaults: ``env_config_cls()`` named after the env, the dev vLLM at 127.0.0.1:9100.

        ``config_defaults`` and ``server_defaults`` override fields of the env and server
        configs.
        """
        env_config = cls.env_config_cls(**{"wandb_name": cls.name, **cls.config_defaults})
        return env_config, [default_server(**cls.server_defaults)]

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

    async def get_next_item(self) -> Item:
        """The training item at the cursor; advances the cursor.

        With ``zero_variance_keep < 1`` items whose recent groups all scored the same are
        skipped with a probability (:class:`~atroposlib.envs.prompt_filter.ZeroVarianceFilter`;
        ``train/skipped_items`` counts them).
        """
        def draw() -> Item:
            item = self.train_item(self.iter)
            self.iter += 1
            return item

        if self.item_filter is None:
            return draw()
        return self.item_filter.next_item(draw, self.rng)

    def record_group(self, item: Item, group: ScoredDataGroup | None) -> ScoredDataGroup | None:
        """Note a finished group's scores for the item filter; return the group unchanged."""
        if self.item_filter is not None and group is not None:
            self.item_filter.record(item, group["scores"])
        return group

    async def collect_trajectories(
        self, item: Item
    ) -> tuple[ScoredDataGroup | None, list[Item]]:
        """Sample ``group_size`` replies in one ``managed_server`` chat call and score them.

        Returns ``(None, [])`` (the group is dropped) when a reply is shorter than
        ``min_completion_tokens`` or :meth:`finish_group` returns None.
        """
        messages = self.prompt(item)
        temperature = self.config.temperature
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=messages, n=self.config.group_size,
                max_tokens=self.max_tokens_for(messages), temperature=temperature,
            )
            nodes = managed.get_state()["nodes"]
        kept = []
        for choice, node in zip(completion.choices, nodes, strict=True):
            generated = sum(1 for m in node.masked_tokens if m != IGNORE_INDEX)
            self.completion_lengths.append(generated)
            if generated >= self.min_completion_tokens:
                kept.append((choice.message.content or "", choice.finish_reason, node))
        scored = await self.score_group(item, [k[0] for k in kept], [k[1] for k in kept])
        group = new_group()
        group["generation_params"] = {"temperature": temperature}
        for (text, _, node), result in zip(kept, scored, strict=True):
            score, details = await resolve_score(result)
            self.train_correct.append(1.0 if score >= 1.0 else 0.0)
            self.train_scores.append(score)
            if details:
                self.train_details.append(details)
            add_rollout(group, node, score, messages + [{"role": "assistant", "content": text}])
        if len(kept) < len(nodes):
            return None, []
        if not (self.send_messages or self.config.include_messages):
            group["messages"] = None
        set_reference_answer(group, self.answer(item))
        return self.record_group(item, self.finish_group(item, group)), []

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
        """One reply per eval item at ``eval_temperature``, scored.

        Returns:
            ``(samples, failed item count)`` (:func:`~atroposlib.envs.eval.eval_samples`).
        """
        return await eval_samples(
            self, list(self.eval_items), self.prompt, self.reward_for,
            max_tokens=self.max_tokens_for, temperature=self.config.eval_temperature,
            answer_fn=self.answer,
        )

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
        if self.item_filter is not None:
            metrics["train/skipped_items"] = float(self.item_filter.take_skipped())
        await super().wandb_log(metrics)

    def save_checkpoint(self, step: int, data: dict[str, Any] | None = None) -> None:
        """Save the cursor (``iter``) with ``data``; ``load_checkpoint`` restores it."""
        super().save_checkpoint(step, {"iter": self.iter, **(data or {})})


__all__ = ["SingleTurnEnv", "SingleTurnEnvConfig"]
