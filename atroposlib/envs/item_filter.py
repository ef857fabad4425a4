"""Online difficulty filtering: sample less often the items whose recent groups all scored the same.

A GRPO group whose rewards are all equal has zero advantage everywhere and teaches nothing; with
``ensure_scores_are_not_same`` the env drops it after paying for its rollouts. That is DAPO's
dynamic sampling (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
Scale", arXiv:2503.14476, section 3.2): over-sample and keep only groups with some signal. Late
in a run most sampled groups are dropped that way (83% by minute 14 of the quickstart), so the
sampler spends most of its time on items the policy always solves, or never does.

This filter acts before sampling, on what each item's earlier groups showed, as prime-rl's
online difficulty filtering does (items whose pass rate crosses an easy or a hard threshold are
sampled at reduced rates) and POLARIS (An et al. 2025) does for solved items (items the policy
answers right every time leave the training pool). Per item id it keeps a sampling weight in
``[floor, 1]``:

* an unseen item, or one whose last group had mixed scores, has weight 1;
* each all-solved group (every score equal and ``>= solved_score``) multiplies its weight by
  ``solved_keep``: a solved item stays solved while the policy improves, so it is cut hard;
* each all-failed group (every score equal and below ``solved_score``) multiplies it by
  ``failed_keep``: an item too hard now often becomes learnable as the policy improves, so it
  is cut gently;
* the weight never falls below ``floor``, so no item is starved: a solved item is still seen
  now and then, and a mixed group restores its full weight.

Items are drawn from the env as usual and each is kept with probability equal to its weight
(rejection sampling, at most ``max_draws`` draws per item handed out), so the env's own order
and item generator are untouched and an env needs only an item id (``BaseEnv.item_id``; by
default the item's JSON). State is in memory only: a restarted env starts with every item
unseen.

For generated tasks with many distinct items (arithmetic at difficulty 4 has about 11,000
training problems) items rarely recur within a short run, so the weights above do little. The
filter can therefore also **replay learnable items** (``replay > 0``): an item whose group came
back mixed joins a bounded replay set with priority equal to the variance of the group's scores.
For 0/1 rewards with a share ``p`` solved that is ``p (1 - p)``, the "learnability" of Foster and
Foerster (2025, "Learning to Reason at the Frontier of Learnability", arXiv:2502.12272, section
3), who sample training prompts in proportion to it; for other rewards it is the spread GRPO's
advantages come from. A share ``replay`` of the items handed out is then drawn
from that set in proportion to priority; an item leaves it after ``replay_times`` replays, when
a group of it comes back all-same, or when a more learnable item needs its place.

It can also **screen candidates by a predicted solve rate** (``screen > 1``), for tasks whose
items rarely recur and carry a reference answer. Per item handed out it draws ``screen``
candidates (through the weights above) and asks the env for a signal of how likely the policy
is to solve each (``answer_logprob``: the policy's log-probability of the reference answer,
after the working the env writes before it; one prompt-scoring request to the inference
server, no sampling). A
small logistic model, refitted after every group on the last groups' outcomes
(:class:`SolveRateModel`), turns the signal into a solve rate ``p``; the candidate whose group
of ``G`` is most likely to come back mixed, ``1 - p^G - (1 - p)^G``, is handed out (or, with
``screen_rule="weighted"``, one drawn in proportion to that chance). This is
the selection rule of Prompt Curriculum Learning (Gao et al. 2025, "Prompt Curriculum
Learning for Efficient LLM Post-Training", arXiv:2510.01135: prompts of intermediate
predicted difficulty, from a value model) with the policy's own likelihood of the reference
answer as the predictor instead of a separately trained value model.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class DifficultySettings:
    """The filter's knobs.

    :func:`settings_from_config` reads them from the env config's ``difficulty_filter*``
    fields, where their defaults live.

    Attributes:
        solved_keep: weight factor after an all-solved group, in (0, 1].
        failed_keep: weight factor after an all-failed group, in (0, 1].
        floor: the least weight, in (0, 1]: the item is still drawn at this rate.
        solved_score: a score at or above it counts as solved.
        max_draws: items drawn at most to hand out one (the last is kept whatever its weight).
        replay: share of the items handed out that are replays of learnable items, in [0, 1).
        replay_size: most items held for replay.
        replay_times: most replays of one item after the group that made it learnable.
        screen: candidates scored per item handed out by their predicted solve rate (1 = no
            screening; see :class:`SolveRateModel`).
        screen_rule: ``"best"`` hands out the candidate with the highest chance of a mixed
            group; ``"weighted"`` draws one in proportion to that chance.
        screen_window: groups the solve-rate model is fitted on (the most recent).
    """

    solved_keep: float
    failed_keep: float
    floor: float
    solved_score: float
    max_draws: int = 64
    replay: float = 0.0
    replay_size: int = 256
    replay_times: int = 2
    screen: int = 1
    screen_rule: Literal["best", "weighted"] = "best"
    screen_window: int = 256

    def __post_init__(self) -> None:
        """Check the ranges.

        Raises:
            ValueError: a factor or the floor outside (0, 1], ``replay`` outside [0, 1), or
                ``max_draws``, ``replay_size``, ``replay_times``, ``screen`` or
                ``screen_window`` < 1, or ``screen_rule`` neither ``"best"`` nor ``"weighted"``.
        """
        for name in ("solved_keep", "failed_keep", "floor"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"difficulty filter {name} must be in (0, 1], got {value}")
        if not 0.0 <= self.replay < 1.0:
            raise ValueError(f"difficulty filter replay must be in [0, 1), got {self.replay}")
        for name in ("max_draws", "replay_size", "replay_times", "screen", "screen_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"difficulty filter {name} must be >= 1, got {getattr(self, name)}")
        if self.screen_rule not in ("best", "weighted"):
            raise ValueError(f"difficulty filter screen_rule must be 'best' or 'weighted', "
                             f"got {self.screen_rule!r}")


@dataclass(slots=True)
class HeldItem:
    """A learnable item held for replay.

    Attributes:
        item: the item, as the env's ``get_next_item`` returned it.
        priority: the population variance of its last mixed group's scores (higher: drawn
            more often).
        replays_left: how many more times it is handed out before it leaves the replay set.
    """

    item: Any
    priority: float
    replays_left: int


def mixed_chance(p: float, group_size: int) -> float:
    """The chance that a group of ``group_size`` pass/fail rollouts comes back mixed.

    With each rollout solved independently with probability ``p``, a group is all-solved with
    probability ``p^G`` and all-failed with ``(1 - p)^G``; the rest of the time its scores
    differ and GRPO's advantages are not all zero.

    Args:
        p: solve rate, in [0, 1].
        group_size: rollouts per group, ``G`` >= 1.

    Returns:
        ``1 - p^G - (1 - p)^G``, in [0, 1] (0 for a group of one).
    """
    return max(0.0, 1.0 - p ** group_size - (1.0 - p) ** group_size)


def reply_log_odds(logprob: float) -> float:
    """The log-odds ``log(q / (1 - q))`` of a reply of log-probability ``logprob`` (nats, <= 0).

    The feature of :class:`SolveRateModel`: with its prior coefficients the predicted solve
    rate is ``q = exp(logprob)`` itself. Log-probabilities at or above about -1e-9 are treated
    as -1e-9, so a certain reply gets a large finite log-odds instead of infinity.
    """
    lp = min(float(logprob), -1e-9)
    return lp - math.log(-math.expm1(lp))


def _sigmoid(z: float) -> float:
    """``1 / (1 + e^-z)`` without overflow for large ``|z|``."""
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


class SolveRateModel:
    """A solve rate from a signal: ``p = sigmoid(a + b x)``, refitted to the last groups.

    ``x`` is :func:`reply_log_odds` of the signal (the policy's log-probability of the reference
    answer), so the prior ``a = 0, b = 1`` predicts that the policy solves an item exactly as
    often as it would write the reference answer. Replies that say the answer in other words,
    and the policy moving between the signal and the group, pull the truth away
    from that; the model follows by maximum likelihood over the last ``window`` groups (each
    group: its signal, ``k`` solved of ``n``), with a ridge penalty ``ridge / 2 * |theta -
    prior|^2`` that keeps a fit on few groups near the prior. The fit is Newton's method on the
    penalized binomial log-likelihood (logistic regression by IRLS), a few iterations from the
    last solution after every group.

    Args:
        window: groups kept for the fit (the most recent).
        ridge: strength of the pull toward the prior coefficients.
        prior: ``(a, b)`` before any group is seen.
    """

    def __init__(self, window: int = 256, ridge: float = 1.0,
                 prior: tuple[float, float] = (0.0, 1.0)):
        self.prior = prior
        self.ridge = ridge
        self.coef: tuple[float, float] = prior
        #: ``(x, solved, total)`` of the last ``window`` groups
        self.groups: deque[tuple[float, int, int]] = deque(maxlen=window)

    def predict(self, logprob: float) -> float:
        """The predicted solve rate of an item whose signal is ``logprob`` (nats)."""
        a, b = self.coef
        return _sigmoid(a + b * reply_log_odds(logprob))

    def observe(self, logprob: float, solved: int, total: int, iterations: int = 4) -> None:
        """Add one group (``solved`` of ``total`` rollouts) with signal ``logprob``, then refit.

        Raises:
            ValueError: ``total`` < 1 or ``solved`` outside ``[0, total]``.
        """
        if total < 1 or not 0 <= solved <= total:
            raise ValueError(f"a group needs 0 <= solved <= total and total >= 1, got {solved} of {total}")
        self.groups.append((reply_log_odds(logprob), solved, total))
        a, b = self.coef
        a0, b0 = self.prior
        lam = self.ridge
        for _ in range(iterations):
            # gradient and Hessian of the penalized negative log-likelihood
            ga, gb = lam * (a - a0), lam * (b - b0)
            haa, hab, hbb = lam, 0.0, lam
            for x, k, n in self.groups:
                p = _sigmoid(a + b * x)
                r = n * p - k
                w = n * p * (1.0 - p)
                ga += r
                gb += r * x
                haa += w
                hab += w * x
                hbb += w * x * x
            det = haa * hbb - hab * hab
            if det <= 0:
                break
            a -= (hbb * ga - hab * gb) / det
            b -= (haa * gb - hab * ga) / det
        self.coef = (a, b)


class DifficultySampler:
    """Per-item weights from recent groups, and the seeded draw that applies them.

    Args:
        settings: the knobs.
        seed: seed of the acceptance draws (the same seed and the same sequence of items and
            scores give the same choices).
    """

    def __init__(self, settings: DifficultySettings, seed: int = 0):
        self.settings = settings
        self.rng = random.Random(seed)
        self.weights: dict[Hashable, float] = {}
        #: learnable items held for replay, by item id
        self.replays: dict[Hashable, HeldItem] = {}
        #: counters since the last :meth:`take_counts`: draws, skipped, replays, groups by kind
        self.counts = {"drawn": 0, "skipped": 0, "replayed": 0, "solved": 0, "failed": 0, "mixed": 0}

    def weight(self, item_id: Hashable) -> float:
        """The item's sampling weight (1.0 for an item never recorded)."""
        return self.weights.get(item_id, 1.0)

    def record(self, item_id: Hashable, scores: Sequence[float], item: Any = None) -> str:
        """Update the item's weight (and its place in the replay set) from one group's scores.

        Args:
            item_id: the item's id.
            scores: the group's scores, one per rollout.
            item: the item itself, kept for replay when the group is mixed (None: not kept).

        Returns:
            The group's kind: ``"solved"``, ``"failed"`` or ``"mixed"`` (a group of one score,
            or of several different scores, is mixed: it is not one that gets dropped).
        """
        s = self.settings
        if len(scores) > 1 and max(scores) == min(scores):
            kind = "solved" if scores[0] >= s.solved_score else "failed"
            factor = s.solved_keep if kind == "solved" else s.failed_keep
            self.weights[item_id] = max(s.floor, self.weight(item_id) * factor)
            self.replays.pop(item_id, None)  # no signal now: nothing to replay
        else:
            kind = "mixed"
            self.weights.pop(item_id, None)
            if item is not None and s.replay > 0 and len(scores) > 1:
                self._hold(item_id, item, statistics.pvariance(scores))
        self.counts[kind] += 1
        return kind

    def _hold(self, item_id: Hashable, item: Any, priority: float) -> None:
        """Keep ``item`` for replay; a full set gives up its least learnable item, if lower."""
        if item_id in self.replays:
            self.replays[item_id].priority = priority  # its replays left stay as they are
            return
        if len(self.replays) >= self.settings.replay_size:
            lowest = min(self.replays, key=lambda key: self.replays[key].priority)
            if self.replays[lowest].priority >= priority:
                return
            del self.replays[lowest]
        self.replays[item_id] = HeldItem(item, priority, self.settings.replay_times)

    def _replay(self) -> Any:
        """A held item drawn in proportion to its priority (one replay used), or None."""
        if not self.replays or self.rng.random() >= self.settings.replay:
            return None
        keys = list(self.replays)
        key = self.rng.choices(keys, weights=[self.replays[k].priority for k in keys])[0]
        held = self.replays[key]
        held.replays_left -= 1
        if held.replays_left <= 0:
            del self.replays[key]
        self.counts["replayed"] += 1
        return held.item

    async def next_item(self, draw: Callable[[], Awaitable[Any]],
                        item_id: Callable[[Any], Hashable | None]) -> Any:
        """Draw items with ``await draw()`` until one is accepted; return it.

        An item is accepted with probability :meth:`weight` of ``item_id(item)``; an item
        without an id (None) and the ``max_draws``-th item are always accepted, and None from
        ``draw`` (nothing to do now) is returned at once. With ``replay > 0``, a share
        ``replay`` of the calls returns a held learnable item instead, without drawing.
        """
        replayed = self._replay()
        if replayed is not None:
            return replayed
        for attempt in range(self.settings.max_draws):
            item = await draw()
            if item is None:
                return None
            self.counts["drawn"] += 1
            key = item_id(item)
            last = attempt == self.settings.max_draws - 1
            if key is None or last or self.rng.random() < self.weight(key):
                return item
            self.counts["skipped"] += 1
        return None  # pragma: no cover - the last draw is always accepted

    def take_counts(self) -> dict[str, int]:
        """The counters since the last call (then reset)."""
        counts = dict(self.counts)
        self.counts = dict.fromkeys(self.counts, 0)
        return counts


def settings_from_config(config: Any) -> DifficultySettings | None:
    """The filter's settings from an env config, or None when ``difficulty_filter`` is off."""
    if not getattr(config, "difficulty_filter", False):
        return None
    return DifficultySettings(solved_keep=config.difficulty_filter_solved_keep,
                              failed_keep=config.difficulty_filter_failed_keep,
                              floor=config.difficulty_filter_floor,
                              solved_score=config.difficulty_filter_solved_score,
                              replay=config.difficulty_filter_replay,
                              replay_size=config.difficulty_filter_replay_size,
                              replay_times=config.difficulty_filter_replay_times,
                              screen=config.difficulty_filter_screen,
                              screen_rule=config.difficulty_filter_screen_rule)


__all__ = ["DifficultySampler", "DifficultySettings", "SolveRateModel",
           "mixed_chance", "reply_log_odds", "settings_from_config"]
