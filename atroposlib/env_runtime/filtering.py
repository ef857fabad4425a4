"""The runners' side of the item filter (:mod:`atroposlib.envs.item_filter`).

The one place the filter is applied: the serve loop and the ``process`` runner both take
their items from :meth:`ItemFilter.next_item` and hand each item's group scores to
:meth:`ItemFilter.note`, when the env config's ``item_filter.enabled`` is on
(``--env.item_filter.enabled``, or the earlier ``difficulty_filter`` / ``zero_variance_keep``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Sequence
from typing import Any

from atroposlib.envs.item_filter import (
    ItemFilterConfig,
    ItemSampler,
    SolveRateModel,
    mixed_chance,
    settings_from_config,
)

logger = logging.getLogger(__name__)

#: Most signals of screened items held until their groups come back.
SIGNALS_HELD = 4096


class ItemFilter:
    """The runners' side of the filter: draws through it, feeds it, counts in ``env.stats``.

    ``env.stats`` gets ``difficulty_drawn`` / ``difficulty_skipped`` (items drawn from the env,
    and drawn but not handed out), ``difficulty_replayed`` (held learnable items handed out
    again) and ``difficulty_solved`` / ``difficulty_failed`` / ``difficulty_mixed`` (groups
    recorded by kind).
    """

    def __init__(self, env: Any, settings: ItemFilterConfig):
        """Filter ``env``'s items; the draws are seeded by its config's ``seed`` (0 if none).

        Raises:
            ValueError: ``settings.screen`` > 1 but the env has no ``answer_logprob`` (only
                single-turn envs with a reference answer can be screened).
        """
        self.env = env
        self.sampler = ItemSampler(settings, seed=int(getattr(env.config, "seed", 0) or 0))
        self.model: SolveRateModel | None = None
        #: the signal of each screened item handed out and not yet noted, by item id
        self.signals: dict[Hashable, float] = {}
        if settings.screen > 1:
            if not callable(getattr(env, "answer_logprob", None)):
                raise ValueError(
                    f"item_filter.screen={settings.screen} needs an env with "
                    f"answer_logprob(item) (SingleTurnEnv and its subclasses); "
                    f"{type(env).__name__} has none: set --env.item_filter.screen 1")
            self.model = SolveRateModel(window=settings.screen_window)

    @classmethod
    def for_env(cls, env: Any) -> ItemFilter | None:
        """A filter when ``env.config.item_filter.enabled`` is on, else None.

        Raises:
            ValueError: as the constructor.
        """
        settings = settings_from_config(env.config)
        return None if settings is None else cls(env, settings)

    async def next_item(self) -> Any:
        """The next item to roll out (see :meth:`~atroposlib.envs.item_filter.ItemSampler.next_item`).

        With screening on, one of ``screen`` candidates drawn that way, chosen by
        :meth:`screen`.
        """
        try:
            if self.model is None:
                return await self.sampler.next_item(self.env.get_next_item, self.env.item_id)
            candidates = []
            for _ in range(self.sampler.settings.screen):
                item = await self.sampler.next_item(self.env.get_next_item, self.env.item_id)
                if item is None:
                    break
                candidates.append(item)
            return await self.screen(candidates) if candidates else None
        finally:
            self._count()

    async def screen(self, candidates: Sequence[Any]) -> Any:
        """The candidate whose group is most likely to come back mixed (:func:`mixed_chance`).

        With ``screen_rule="weighted"``, a candidate drawn at random with probability
        proportional to that chance instead. Each candidate's signal is the env's
        ``answer_logprob`` (requested concurrently); a candidate without one (None, or the
        request failed) ranks last (is never drawn), and with no signal at all the first
        candidate is handed out. Counts ``difficulty_screened`` (candidates
        scored) in ``env.stats``.
        """
        assert self.model is not None
        signals = await asyncio.gather(*(self._signal(c) for c in candidates))
        self.env.stats["difficulty_screened"] += len(candidates)
        group_size = int(getattr(self.env.config, "group_size", 1) or 1)
        chances = [-1.0 if signal is None else mixed_chance(self.model.predict(signal), group_size)
                   for signal in signals]
        if self.sampler.settings.screen_rule == "weighted" and sum(c for c in chances if c > 0):
            best = self.sampler.rng.choices(range(len(candidates)),
                                            weights=[max(c, 0.0) for c in chances])[0]
        else:
            best = max(range(len(candidates)), key=chances.__getitem__)  # the first on ties
        chosen = candidates[best]
        if signals[best] is not None:
            key = self.env.item_id(chosen)
            if key is not None:
                self.signals[key] = signals[best]
                while len(self.signals) > SIGNALS_HELD:  # items never noted (a crashed rollout)
                    del self.signals[next(iter(self.signals))]
        return chosen

    async def _signal(self, item: Any) -> float | None:
        try:
            return await self.env.answer_logprob(item)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - an unscored candidate ranks last, the run goes on
            self.env.stats["difficulty_screen_failed"] += 1
            failed = self.env.stats["difficulty_screen_failed"]
            if failed == 1 or failed % 1000 == 0:  # a server without prompt log-probs fails every time
                logger.warning("item filter screen: answer_logprob failed %d time(s), last with %s: "
                               "%s; such candidates rank last", failed, type(exc).__name__, exc)
            return None

    def note(self, item: Any, groups_scores: Sequence[Sequence[float]]) -> None:
        """Record the scores of each group the env returned for ``item``.

        A screened item's groups also refit the solve-rate model (a rollout scoring at least
        ``solved_score`` counts as solved).
        """
        key = self.env.item_id(item)
        if key is not None:
            # an item re-queued without a group (inference down) keeps its signal for its retry
            signal = self.signals.pop(key, None) if groups_scores else self.signals.get(key)
            for scores in groups_scores:
                self.sampler.record(key, scores, item)
                if signal is not None and self.model is not None and scores:
                    solved = sum(score >= self.sampler.settings.solved_score for score in scores)
                    self.model.observe(signal, solved, len(scores))
            self._count()

    def _count(self) -> None:
        for kind, n in self.sampler.take_counts().items():
            if n:
                self.env.stats[f"difficulty_{kind}"] += n


#: The earlier name of :class:`ItemFilter`.
DifficultyFilter = ItemFilter


async def next_item(env: Any, item_filter: ItemFilter | None) -> Any:
    """The env's next item: through ``item_filter`` when there is one, else ``get_next_item``."""
    return await (env.get_next_item() if item_filter is None else item_filter.next_item())


__all__ = ["SIGNALS_HELD", "DifficultyFilter", "ItemFilter", "next_item"]
