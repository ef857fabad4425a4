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

from atroposlib.envs.item_features import (
    Calibration,
    FeatureSolveModel,
    checked_features,
    item_text,
    text_features,
)
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
    recorded by kind). With screening on also ``difficulty_screened`` (candidates scored),
    ``difficulty_screen_failed`` (candidates whose signal failed), ``difficulty_screen_warmup``
    (items handed out unscreened while the feature model learns), and the solve-rate model's
    calibration over the last ``screen_window`` groups it predicted before they ran:
    ``difficulty_screen_predicted`` / ``difficulty_screen_observed`` (mean solve rates per
    rollout) and ``difficulty_screen_logloss`` (nats per rollout; predicting 0.5 for every
    item scores 0.693, and items that truly are coin flips score that at best).
    """

    def __init__(self, env: Any, settings: ItemFilterConfig):
        """Filter ``env``'s items; the draws are seeded by its config's ``seed`` (0 if none).

        Raises:
            ValueError: ``settings.screen`` > 1 with ``screen_signal="answer_logprob"`` but the
                env has no ``answer_logprob`` (only single-turn envs with a reference answer).
        """
        self.env = env
        self.sampler = ItemSampler(settings, seed=int(getattr(env.config, "seed", 0) or 0))
        self.model: SolveRateModel | FeatureSolveModel | None = None
        self.calibration = Calibration(settings.screen_window)
        #: the signal (log-prob or features) of each screened item handed out and not yet noted
        self.signals: dict[Hashable, Any] = {}
        if settings.screen > 1 and settings.screen_signal == "features":
            self.model = FeatureSolveModel(window=settings.screen_window,
                                           min_groups=settings.screen_min_groups)
        elif settings.screen > 1:
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
            if not self.model.ready:  # the feature model has not learned enough: teach it
                item = await self.sampler.next_item(self.env.get_next_item, self.env.item_id)
                if item is not None:
                    self.env.stats["difficulty_screen_warmup"] += 1
                    self._hold_signal(item, await self._signal(item))
                return item
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
        ``answer_logprob`` (requested concurrently) or, with ``screen_signal="features"``, its
        ``item_features``; a candidate without one (None, or it failed) ranks last (is never
        drawn), and with no signal at all the first candidate is handed out. Counts
        ``difficulty_screened`` (candidates scored) in ``env.stats``.
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
        self._hold_signal(chosen, signals[best])
        return chosen

    def _hold_signal(self, item: Any, signal: Any) -> None:
        """Keep the signal of an item handed out until its groups come back to :meth:`note`."""
        key = self.env.item_id(item) if signal is not None else None
        if key is not None:
            self.signals[key] = signal
            while len(self.signals) > SIGNALS_HELD:  # items never noted (a crashed rollout)
                del self.signals[next(iter(self.signals))]

    async def _signal(self, item: Any) -> Any:
        """``answer_logprob`` (nats) or the item's features; None when it has none or it failed."""
        features = self.sampler.settings.screen_signal == "features"
        try:
            if not features:
                return await self.env.answer_logprob(item)
            describe = getattr(self.env, "item_features", None)
            found = describe(item) if callable(describe) else text_features(item_text(item))
            return None if found is None else checked_features(found)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - an unscored candidate ranks last, the run goes on
            self.env.stats["difficulty_screen_failed"] += 1
            failed = self.env.stats["difficulty_screen_failed"]
            if failed == 1 or failed % 1000 == 0:  # a server without prompt log-probs fails every time
                logger.warning("item filter screen: %s failed %d time(s), last with %s: %s; such "
                               "candidates rank last", "item_features" if features else "answer_logprob",
                               failed, type(exc).__name__, exc)
            return None

    def note(self, item: Any, groups_scores: Sequence[Sequence[float]]) -> None:
        """Record the scores of each group the env returned for ``item``.

        A screened item's groups also refit the solve-rate model (a rollout scoring at least
        ``solved_score`` counts as solved), after the model's prediction for it, made before
        the refit, joins the calibration counters.
        """
        key = self.env.item_id(item)
        if key is not None:
            # an item re-queued without a group (inference down) keeps its signal for its retry
            signal = self.signals.pop(key, None) if groups_scores else self.signals.get(key)
            for scores in groups_scores:
                self.sampler.record(key, scores, item)
                if signal is not None and self.model is not None and scores:
                    solved = sum(score >= self.sampler.settings.solved_score for score in scores)
                    if self.model.ready:
                        self.calibration.add(self.model.predict(signal), solved, len(scores))
                        for name, value in self.calibration.summary().items():
                            self.env.stats[f"difficulty_screen_{name}"] = round(value, 4)
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
