"""The item filter: sample less often the items whose recent groups all scored the same.

Its settings are the ``item_filter`` section of every env config (:class:`ItemFilterConfig`,
``--env.item_filter.*``); the runners apply it (:mod:`atroposlib.env_runtime.filtering`).

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
default the item's JSON, :func:`item_key`). State is in memory only: a restarted env starts
with every item unseen.

The zero-variance rule of GRESO (Zheng et al. 2025, "Act Only When It Pays", arXiv:2506.02177,
Sec. 4: an item whose last ``k`` groups were all-same is sampled with probability ``keep ** k``,
``k <= 4``) is this filter with ``solved_keep = failed_keep = keep`` and ``floor = keep ** 4``
(:meth:`ItemFilterConfig.zero_variance`; the ``zero_variance_keep`` env setting).

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
answer as the predictor instead of a separately trained value model. With
``screen_signal="features"`` the predictor costs no inference call: a logistic model on item
features learned from earlier groups (:mod:`atroposlib.envs.item_features`).
"""

from __future__ import annotations

import json
import logging
import math
import random
import statistics
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

logger = logging.getLogger(__name__)

def item_key(item: Any) -> str:
    """The default item id (:meth:`~atroposlib.envs.base.BaseEnv.item_id`): the item's JSON.

    Keys are sorted; values JSON cannot hold are written with ``str``. Items with the same key
    share one record of how their groups scored.
    """
    return json.dumps(item, sort_keys=True, default=str)


class ItemFilterConfig(BaseModel):
    """The item filter's settings: the ``item_filter`` section of every env config.

    On the command line ``--env.item_filter.<field>`` (``--env.item-filter.solved-keep``
    too), in YAML ``env: {item_filter: {...}}``, in Python
    ``BaseEnvConfig(item_filter=ItemFilterConfig(enabled=True))`` or a dict. The defaults
    live here and nowhere else. The earlier flat names (``difficulty_filter``,
    ``difficulty_filter_<field>``, and ``zero_variance_keep``: :meth:`zero_variance`) are
    still accepted by env configs (:data:`LEGACY_KEYS`).

    The model is frozen (as the env config is once a runner starts): build a new one, or use
    ``model_copy(update=...)``.

    Raises:
        pydantic.ValidationError (a ValueError): a factor or the floor outside (0, 1],
            ``replay`` outside [0, 1), ``max_draws``, ``replay_size``, ``replay_times``,
            ``screen``, ``screen_window`` or ``screen_min_groups`` below 1, ``screen_rule``
            neither ``"best"`` nor ``"weighted"``, ``screen_signal`` neither
            ``"answer_logprob"`` nor ``"features"``, or an unknown field.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(
        default=False,
        description="Sample less often the items whose recent groups all scored the same "
        "(online difficulty filtering): each all-solved group multiplies an item's sampling "
        "weight by solved_keep, each all-failed one by failed_keep, a mixed group restores it "
        "to 1, never below floor. Items are identified by the env's item_id(). Applied in "
        "serve and process modes.",
    )
    solved_keep: float = Field(default=0.1, gt=0, le=1,
                               description="Weight factor after an all-solved group.")
    failed_keep: float = Field(default=0.5, gt=0, le=1,
                               description="Weight factor after an all-failed group.")
    floor: float = Field(default=0.05, gt=0, le=1,
                         description="Least sampling weight of an item (no item is starved).")
    solved_score: float = Field(
        default=1.0, description="A group whose equal scores are >= this counts as solved.")
    max_draws: int = Field(
        default=64, ge=1,
        description="Items drawn at most to hand out one (the last is kept whatever its weight).")
    replay: float = Field(
        default=0.0, ge=0, lt=1,
        description="Share of the items handed out that replay an item whose recent group was "
        "mixed, drawn in proportion to the variance of that group's scores (p(1-p) for 0/1 "
        "rewards: the learnability of Foster and Foerster 2025, arXiv:2502.12272). For tasks "
        "whose items rarely recur. 0 disables. On arithmetic it lowered held-out accuracy: "
        "measure first (see docs/benchmarks.md).",
    )
    replay_size: int = Field(default=256, ge=1, description="Most learnable items held for replay.")
    replay_times: int = Field(
        default=2, ge=1, description="Most replays of an item after the group that made it learnable.")
    screen: int = Field(
        default=1, ge=1,
        description="Candidates drawn per item handed out, of which the one whose group is most "
        "likely to come back mixed is rolled out, by a solve rate predicted from the policy's "
        "log-probability of the reference answer (one prompt-scoring request per candidate, no "
        "sampling; the selection rule of Prompt Curriculum Learning, arXiv:2510.01135). Needs a "
        "single-turn env with a reference answer and a vLLM server, unless screen_signal is "
        "'features'. 1 disables. Each candidate costs the sampler a prefill. On arithmetic it cut the groups dropped as all-same, but "
        "held-out accuracy came out lower, and with small groups it gave fewer mixed groups per "
        "second: measure first (see docs/benchmarks.md).",
    )
    screen_rule: Literal["best", "weighted"] = Field(
        default="best",
        description="With screen > 1: 'best' rolls out the candidate most likely to come back "
        "mixed; 'weighted' draws one at random in proportion to that chance, so items predicted "
        "near-certain (solved or failed) are still skipped but the candidates in between keep "
        "their mix of problem types.",
    )
    screen_window: int = Field(
        default=256, ge=1, description="Groups the solve-rate model is fitted on (the most recent).")
    screen_signal: Literal["answer_logprob", "features"] = Field(
        default="answer_logprob",
        description="With screen > 1, what predicts a candidate's solve rate: 'answer_logprob' "
        "(the policy's log-probability of the reference answer: one prompt-scoring request per "
        "candidate) or 'features' (the env's item_features(item), by default hashed words and "
        "character 3-grams of the prompt, through a logistic model refitted on recent groups: "
        "no inference call, so a larger screen costs only draws from the env).",
    )
    screen_min_groups: int = Field(
        default=32, ge=1,
        description="With screen_signal='features': groups the feature model learns from before "
        "it screens; until then items are handed out unscreened, one drawn per item.",
    )

    @classmethod
    def zero_variance(cls, keep: float, max_streak: int = 4, **values: Any) -> ItemFilterConfig:
        """The zero-variance rule of GRESO as item filter settings (``zero_variance_keep``).

        Zheng et al. 2025 ("Act Only When It Pays", arXiv:2506.02177, Sec. 4) sample an item
        whose last ``k`` groups were all zero-variance with probability ``keep ** k``, ``k``
        capped at ``max_streak``. That is this filter with ``solved_keep = failed_keep = keep``
        and ``floor = keep ** max_streak``: each all-same group multiplies the weight by
        ``keep`` down to the floor, a mixed group restores it to 1.

        Args:
            keep: probability of sampling an item after one zero-variance group, in (0, 1];
                1.0 gives a disabled filter.
            max_streak: the streak counted at most, >= 1.
            **values: other fields (``max_draws`` ...).

        Raises:
            ValueError: ``keep`` outside (0, 1] or ``max_streak`` < 1.
        """
        if not 0.0 < keep <= 1.0:
            raise ValueError(f"zero_variance_keep must be in (0, 1], got {keep}")
        if max_streak < 1:
            raise ValueError(f"max_streak must be >= 1, got {max_streak}")
        return cls(**{**values, "enabled": keep < 1.0, "solved_keep": keep, "failed_keep": keep,
                      "floor": keep ** max_streak})


#: Earlier flat env-config keys -> the ``item_filter`` field each one sets
#: (``zero_variance_keep`` sets four of them: :meth:`ItemFilterConfig.zero_variance`).
LEGACY_KEYS: dict[str, str] = {
    "zero_variance_keep": "solved_keep",  # first: a field's own key given beside it wins
    "difficulty_filter": "enabled",
    **{f"difficulty_filter_{name}": name for name in (
        "solved_keep", "failed_keep", "floor", "solved_score", "replay", "replay_size",
        "replay_times", "screen", "screen_rule")},
}

_warned: set[str] = set()


def move_legacy_keys(values: dict[str, Any], declared: Any = ()) -> dict[str, Any]:
    """``values`` with the earlier flat item filter keys moved into ``values["item_filter"]``.

    Keys in ``declared`` (fields an env config class declares itself) stay where they are.
    Each old key is logged once per process, naming its new spelling. ``zero_variance_keep``
    applies :meth:`ItemFilterConfig.zero_variance` (a value of 1.0 leaves the filter as it
    is) first; the other flat keys then override the same field of it and of an
    ``item_filter`` given beside them.

    Args:
        values: an env config's input mapping (not changed).
        declared: field names the config class declares.

    Returns:
        A new mapping (``values`` itself when it holds no old key).
    """
    old = [key for key in LEGACY_KEYS if key in values and key not in declared]
    if not old:
        return values
    out = dict(values)
    section = out.get("item_filter")
    if isinstance(section, BaseModel):
        section = section.model_dump(exclude_unset=True)
    section = dict(section or {})
    for key in old:
        value = out.pop(key)
        if key not in _warned:
            _warned.add(key)
            new = ("item_filter.enabled, item_filter.solved_keep = item_filter.failed_keep = "
                   "KEEP and item_filter.floor = KEEP**4" if key == "zero_variance_keep"
                   else f"item_filter.{LEGACY_KEYS[key]} (--env.item_filter.{LEGACY_KEYS[key]})")
            logger.warning("env config key %r is deprecated and still accepted: use %s", key, new)
        if key == "zero_variance_keep":
            keep = float(value)
            if keep < 1.0:
                section.update(ItemFilterConfig.zero_variance(keep).model_dump(
                    include={"enabled", "solved_keep", "failed_keep", "floor"}))
        else:
            section[LEGACY_KEYS[key]] = value
    out["item_filter"] = section
    return out


#: The earlier name of :class:`ItemFilterConfig`.
DifficultySettings = ItemFilterConfig


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

    #: It screens from the first candidate on: its prior already predicts.
    ready = True

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


class ItemSampler:
    """Per-item weights from recent groups, and the seeded draw that applies them.

    Args:
        settings: the knobs (only ``enabled`` is not read: a sampler always filters).
        seed: seed of the acceptance draws (the same seed and the same sequence of items and
            scores give the same choices).
    """

    def __init__(self, settings: ItemFilterConfig, seed: int = 0):
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
            if self.accept(item_id(item), attempt):
                return item
        return None  # pragma: no cover - the last draw is always accepted

    def accept(self, key: Hashable | None, attempt: int, rng: random.Random | None = None) -> bool:
        """Whether the ``attempt``-th item drawn (from 0), of id ``key``, is handed out.

        Accepted with probability :meth:`weight` (one draw of ``rng``, the sampler's own when
        None); an item without an id and the ``max_draws``-th item are always accepted, without
        a draw. Counts the item as drawn, and as skipped when refused.
        """
        self.counts["drawn"] += 1
        last = attempt >= self.settings.max_draws - 1
        if key is None or last or (rng or self.rng).random() < self.weight(key):
            return True
        self.counts["skipped"] += 1
        return False

    def take_counts(self) -> dict[str, int]:
        """The counters since the last call (then reset)."""
        counts = dict(self.counts)
        self.counts = dict.fromkeys(self.counts, 0)
        return counts


#: The earlier name of :class:`ItemSampler`.
DifficultySampler = ItemSampler


def settings_from_config(config: Any) -> ItemFilterConfig | None:
    """The env config's ``item_filter`` section, or None when it is off (or absent)."""
    settings = getattr(config, "item_filter", None)
    return settings if isinstance(settings, ItemFilterConfig) and settings.enabled else None


class ZeroVarianceFilter:
    """The zero-variance rule with its earlier interface: an :class:`ItemSampler` keyed by item.

    Same choices as the item filter with :meth:`ItemFilterConfig.zero_variance` settings (an
    item whose last ``k`` groups had zero variance is kept with probability ``keep ** k``,
    ``k <= max_streak``); envs get it through ``zero_variance_keep`` or ``item_filter``.

    Args:
        keep: probability of sampling an item after ONE zero-variance group, in (0, 1].
        max_streak: the streak counted at most, >= 1.
        max_draws: items drawn at most per :meth:`next_item` call, >= 1; the last one drawn is
            returned even if it would be skipped.

    Raises:
        ValueError: ``keep`` is not in (0, 1], or ``max_streak`` / ``max_draws`` is below 1.
    """

    def __init__(self, keep: float, max_streak: int = 4, max_draws: int = 64):
        if not 0.0 < keep <= 1.0:
            raise ValueError(f"keep must be in (0, 1], got {keep}")
        if max_streak < 1 or max_draws < 1:
            raise ValueError(f"max_streak and max_draws must be >= 1, got {max_streak}, {max_draws}")
        self.keep, self.max_streak, self.max_draws = keep, max_streak, max_draws
        self.sampler = ItemSampler(ItemFilterConfig.zero_variance(keep, max_streak, max_draws=max_draws))

    def record(self, item: Any, scores: Sequence[float]) -> None:
        """Note a scored group of ``item`` (zero variance: more than one score, all equal)."""
        self.sampler.record(item_key(item), scores)

    def keep_probability(self, item: Any) -> float:
        """The chance that ``item`` is kept when drawn: ``keep ** streak`` (1.0 without one)."""
        return self.sampler.weight(item_key(item))

    def next_item(self, draw: Callable[[], Any], rng: random.Random) -> Any:
        """Draw items with ``draw()`` until one is kept (acceptance draws from ``rng``)."""
        for attempt in range(self.max_draws):
            item = draw()
            if self.sampler.accept(item_key(item), attempt, rng):
                return item
        return None  # pragma: no cover - the last draw is always accepted

    def take_skipped(self) -> int:
        """Items skipped since the last call (and reset the count)."""
        return self.sampler.take_counts()["skipped"]


__all__ = ["LEGACY_KEYS", "DifficultySampler", "DifficultySettings", "ItemFilterConfig",
           "ItemSampler", "SolveRateModel", "ZeroVarianceFilter", "item_key", "mixed_chance",
           "move_legacy_keys", "reply_log_odds", "settings_from_config"]
