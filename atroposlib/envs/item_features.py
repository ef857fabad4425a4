"""The item filter's free screen signal: item features, and a solve-rate model learned from them.

With ``item_filter.screen_signal="features"`` the screen (``item_filter.screen > 1``, see
:mod:`atroposlib.envs.item_filter`) asks no inference server anything. Each candidate is
described by a few numeric features (:meth:`~atroposlib.envs.base.BaseEnv.item_features`: an
env's own, such as the arithmetic env's operator, digit counts and carries, or by default
:func:`text_features` of the item's prompt text), and :class:`FeatureSolveModel`, a logistic
regression refitted after every group on the last groups' outcomes, predicts its solve rate
``p``. The screen then hands out the candidate whose group is most likely to come back mixed,
``1 - p^G - (1 - p)^G``, as with the ``answer_logprob`` signal: the selection rule of Prompt
Curriculum Learning (Gao et al. 2025, arXiv:2510.01135), with a feature model in place of the
value model PCL trains. Until the model has seen ``screen_min_groups`` groups it knows nothing,
so items are handed out unscreened (one drawn per item) and only teach it.

:class:`Calibration` measures how well either model predicts: over the last groups whose
prediction was made before their outcome, the mean predicted solve rate against the observed
one, and the log-loss per rollout.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections import deque
from collections.abc import Mapping
from typing import Any

#: Hash buckets of :func:`text_features` for word unigrams and for character 3-grams (each).
TEXT_BUCKETS = 32
_TOKEN = re.compile(r"\w+|[^\w\s]")


def _bucket(text: str, buckets: int) -> int:
    """A stable bucket of ``text`` (CRC-32, not Python's salted ``hash``)."""
    return zlib.crc32(text.encode("utf-8")) % buckets


def text_features(text: str, buckets: int = TEXT_BUCKETS) -> dict[str, float]:
    """Generic features of a prompt's text: hashed word and character 3-gram counts, and length.

    Words (runs of letters and digits, and each punctuation mark, lower-cased) are counted into
    ``buckets`` hashed slots ``w<i>``, character 3-grams of the lower-cased text into ``buckets``
    slots ``c<i>`` (the hashing trick: Weinberger et al. 2009, "Feature Hashing for Large Scale
    Multitask Learning"); each count enters as ``log(1 + count)``. ``log_chars`` and
    ``log_words`` are ``log(1 + length)``. At most ``2 * buckets + 2`` features; an empty text
    gives only the two lengths (0.0).

    Args:
        text: the item's prompt text.
        buckets: slots per kind, >= 1.

    Returns:
        ``{name: value}``, only non-zero slots listed.

    Raises:
        ValueError: ``buckets`` < 1.
    """
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    lowered = text.lower()
    words = _TOKEN.findall(lowered)
    counts: dict[str, int] = {}
    for word in words:
        key = f"w{_bucket(word, buckets)}"
        counts[key] = counts.get(key, 0) + 1
    for start in range(len(lowered) - 2):
        key = f"c{_bucket(lowered[start:start + 3], buckets)}"
        counts[key] = counts.get(key, 0) + 1
    features = {key: math.log1p(n) for key, n in counts.items()}
    features["log_chars"] = math.log1p(len(text))
    features["log_words"] = math.log1p(len(words))
    return features


def item_text(item: Any) -> str:
    """The text :func:`text_features` describes an item by: a string item itself, or its JSON.

    For a list of chat messages (``{"role", "content"}`` dicts) the contents joined by
    newlines; anything else as sorted-key JSON (values JSON cannot hold written with ``str``).
    """
    if isinstance(item, str):
        return item
    if isinstance(item, list) and all(isinstance(m, Mapping) and "content" in m for m in item):
        return "\n".join(str(m["content"]) for m in item)
    return json.dumps(item, sort_keys=True, default=str)


def checked_features(features: Mapping[str, float]) -> dict[str, float]:
    """``features`` as a ``{str: float}`` dict, every value finite.

    Raises:
        ValueError: a name that is not a string, or a value that is not a finite number (the
            message names it; fix the env's ``item_features``).
    """
    out: dict[str, float] = {}
    for name, value in features.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not isinstance(name, str) or not math.isfinite(number):
            raise ValueError(f"item features must map names to finite numbers; {name!r} is {value!r}")
        out[name] = number
    return out


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


class FeatureSolveModel:
    """A solve rate from item features: ``p = sigmoid(b + w . z(x))``, refitted to the last groups.

    ``z`` standardizes each feature by its mean and standard deviation over the groups in the
    window (a feature an item lacks is 0), so one ridge strength suits features of any scale.
    The fit maximizes the binomial log-likelihood of the last ``window`` groups (each: its
    features, ``k`` solved of ``n``) minus ``ridge / 2 * |w|^2`` (the intercept ``b`` is not
    penalized): logistic regression with an L2 penalty (Hastie, Tibshirani and Friedman, "The
    Elements of Statistical Learning", 2nd ed., sections 4.4.1 and 4.4.4), by Newton's method
    with step halving, after every group, warm-started from the last fit. Costs a few ``d x d``
    solves per group, ``d`` the number of distinct features in the window (at most 66 for
    :func:`text_features`, 13 for the arithmetic env's): measured on a busy 2-core CPU with
    66 features and 256 groups, 4-15 ms a group (the upper end when numpy's multi-threaded
    BLAS competes for the cores), and about 0.1 ms to featurize and predict a candidate. No
    inference call.

    Args:
        window: groups kept for the fit (the most recent), >= 1.
        ridge: strength of the L2 penalty on the standardized weights, > 0.
        min_groups: groups observed (in all) before :attr:`ready` is True, >= 1.
        iterations: Newton steps per refit, >= 1.

    Raises:
        ValueError: an argument outside its range.
    """

    def __init__(self, window: int = 256, ridge: float = 1.0, min_groups: int = 32,
                 iterations: int = 8):
        if window < 1 or min_groups < 1 or iterations < 1 or not ridge > 0:
            raise ValueError(f"need window, min_groups, iterations >= 1 and ridge > 0, got "
                             f"{window}, {min_groups}, {iterations}, {ridge}")
        self.ridge, self.min_groups, self.iterations = ridge, min_groups, iterations
        #: ``(features, solved, total)`` of the last ``window`` groups
        self.groups: deque[tuple[Mapping[str, float], int, int]] = deque(maxlen=window)
        #: groups observed since the start (not only those in the window)
        self.seen = 0
        self.names: list[str] = []
        self._mean: Any = None
        self._scale: Any = None
        self._weights: Any = None
        self.intercept = 0.0

    @property
    def ready(self) -> bool:
        """Whether it has observed ``min_groups`` groups (the screen waits until then)."""
        return self.seen >= self.min_groups

    def predict(self, features: Mapping[str, float]) -> float:
        """The predicted solve rate of an item with ``features``, in (0, 1).

        Features never seen in the window are ignored; before any group, 0.5.
        """
        if self._weights is None:
            return _sigmoid(self.intercept)
        import numpy as np

        x = np.array([float(features.get(name, 0.0)) for name in self.names])
        return _sigmoid(self.intercept + float(((x - self._mean) / self._scale) @ self._weights))

    def observe(self, features: Mapping[str, float], solved: int, total: int) -> None:
        """Add one group (``solved`` of ``total`` rollouts) of an item with ``features``; refit.

        Raises:
            ValueError: ``total`` < 1, ``solved`` outside ``[0, total]``, or a feature that
                :func:`checked_features` refuses.
        """
        if total < 1 or not 0 <= solved <= total:
            raise ValueError(f"a group needs 0 <= solved <= total and total >= 1, got {solved} of {total}")
        self.groups.append((checked_features(features), solved, total))
        self.seen += 1
        self._fit()

    def _fit(self) -> None:
        import numpy as np

        names = sorted({name for features, _, _ in self.groups for name in features})
        column = {name: i for i, name in enumerate(names)}
        x = np.zeros((len(self.groups), len(names)))
        for row, (features, _, _) in enumerate(self.groups):
            for name, value in features.items():
                x[row, column[name]] = float(value)
        k = np.array([g[1] for g in self.groups], dtype=float)
        n = np.array([g[2] for g in self.groups], dtype=float)
        mean = x.mean(axis=0)
        scale = x.std(axis=0)
        scale[scale < 1e-9] = 1.0  # a constant feature: centered to 0, carries nothing
        z = np.hstack([np.ones((len(k), 1)), (x - mean) / scale])
        penalty = np.full(z.shape[1], self.ridge)
        penalty[0] = 1e-6  # the intercept: barely held, so a one-sided window stays finite
        theta = np.zeros(z.shape[1])
        if self._weights is not None:  # warm start, by feature name
            theta[0] = self.intercept
            for name, weight in zip(self.names, self._weights, strict=True):
                if name in column:
                    theta[1 + column[name]] = weight

        def loss(t: Any) -> float:
            eta = z @ t
            # -log-likelihood: n log(1 + e^eta) - k eta, stably
            return float(np.sum(n * np.logaddexp(0.0, eta) - k * eta) + 0.5 * np.sum(penalty * t * t))

        current = loss(theta)
        for _ in range(self.iterations):
            p = 1.0 / (1.0 + np.exp(-np.clip(z @ theta, -30, 30)))
            grad = z.T @ (n * p - k) + penalty * theta
            hessian = (z.T * (n * p * (1.0 - p))) @ z + np.diag(penalty)
            step = np.linalg.solve(hessian, grad)
            size = 1.0
            while size > 1e-4:
                trial = theta - size * step
                value = loss(trial)
                if value <= current:
                    break
                size /= 2
            else:
                break
            theta, improved = trial, current - value
            current = value
            if improved < 1e-6 * (1.0 + current):  # converged (a warm start: one or two steps)
                break
        self.names, self._mean, self._scale = names, mean, scale
        self.intercept, self._weights = float(theta[0]), theta[1:]


class Calibration:
    """How well predicted solve rates matched the groups that followed, over the last groups.

    Args:
        window: groups kept (the most recent), >= 1.
    """

    def __init__(self, window: int = 256):
        self.groups: deque[tuple[float, int, int]] = deque(maxlen=window)

    def add(self, predicted: float, solved: int, total: int) -> None:
        """One group: its solve rate predicted before it ran, ``solved`` of ``total`` rollouts."""
        if total >= 1:
            self.groups.append((predicted, solved, total))

    def summary(self) -> dict[str, float]:
        """``predicted`` and ``observed`` solve rates (per rollout) and ``logloss`` (nats per rollout).

        The log-loss is ``-(k log p + (n - k) log(1 - p)) / n`` summed over groups, ``p``
        clipped to ``[1e-6, 1 - 1e-6]``. Predicting 0.5 scores ``log 2 = 0.693``; a perfect model scores the
        rollouts' own entropy (0 for all-same groups, 0.693 for even ones). Empty when no
        group was added.
        """
        rollouts = sum(n for _, _, n in self.groups)
        if not rollouts:
            return {}
        loss = 0.0
        for p, k, n in self.groups:
            p = min(max(p, 1e-6), 1 - 1e-6)
            loss -= k * math.log(p) + (n - k) * math.log(1 - p)
        return {"predicted": sum(p * n for p, _, n in self.groups) / rollouts,
                "observed": sum(k for _, k, _ in self.groups) / rollouts,
                "logloss": loss / rollouts}


__all__ = ["TEXT_BUCKETS", "Calibration", "FeatureSolveModel", "checked_features", "item_text",
           "text_features"]
