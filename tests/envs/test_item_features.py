"""The free screen signal: the generic featurizer, the feature solve-rate model, its calibration."""

from __future__ import annotations

import math
import random

import pytest

from atroposlib.envs.item_features import (
    Calibration,
    FeatureSolveModel,
    checked_features,
    item_text,
    text_features,
)
from atroposlib.envs.item_filter import mixed_chance


def test_text_features_are_small_stable_and_count_words_and_trigrams():
    features = text_features("What is 7 + 12? Answer with just the number.")
    assert features == text_features("What is 7 + 12? Answer with just the number.")  # no salted hash
    assert len(features) <= 2 * 32 + 2
    assert features["log_chars"] == pytest.approx(math.log1p(44))
    assert features["log_words"] == pytest.approx(math.log1p(12))  # 10 words, "+", "?" and "."
    assert all(name[0] in "wc" for name in features if not name.startswith("log_"))
    assert text_features("") == {"log_chars": 0.0, "log_words": 0.0}
    assert text_features("a a a a", buckets=1) == {
        "w0": math.log1p(4), "c0": math.log1p(5), "log_chars": math.log1p(7), "log_words": math.log1p(4)}
    with pytest.raises(ValueError, match="buckets"):
        text_features("x", buckets=0)


def test_item_text_reads_strings_messages_and_json():
    assert item_text("hi") == "hi"
    assert item_text([{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]) \
        == "be brief\n2+2?"
    assert item_text({"b": 1, "a": "x"}) == '{"a": "x", "b": 1}'


def test_features_must_be_finite_numbers():
    assert checked_features({"x": 1, "y": True}) == {"x": 1.0, "y": 1.0}
    for bad in ({"x": math.nan}, {"x": "big"}, {"x": math.inf}, {3: 1.0}):
        with pytest.raises(ValueError, match="finite numbers"):
            checked_features(bad)


def _rule_groups(rng, n, group_size=8):
    """Items with ``easy`` = 1 are always solved, the others never; ``noise`` carries nothing."""
    for _ in range(n):
        easy = rng.random() < 0.5
        yield {"easy": float(easy), "noise": rng.gauss(0, 1)}, group_size if easy else 0, group_size


def test_the_model_learns_a_rule_and_the_screen_then_skips_the_all_same_items():
    rng = random.Random(0)
    model = FeatureSolveModel(window=64, min_groups=16)
    assert model.predict({"easy": 1.0}) == 0.5 and not model.ready
    for features, solved, total in _rule_groups(rng, 40):
        model.observe(features, solved, total)
    assert model.ready and model.seen == 40 and len(model.groups) == 40
    assert model.predict({"easy": 1.0, "noise": 0.3}) > 0.9
    assert model.predict({"easy": 0.0, "noise": 0.3}) < 0.1
    # the screen's rule prefers an unknown item to one predicted all-same
    unknown = {"easy": 0.5, "noise": 0.0}
    chances = [mixed_chance(model.predict(f), 8) for f in ({"easy": 1.0}, {"easy": 0.0}, unknown)]
    assert max(range(3), key=chances.__getitem__) == 2
    assert chances[0] < 0.5 and chances[1] < 0.5


def test_the_model_is_calibrated_on_random_labels():
    rng = random.Random(1)
    model = FeatureSolveModel(window=256, min_groups=32)
    calibration = Calibration(window=256)
    for _ in range(600):
        features = {"x": rng.gauss(0, 1), "y": rng.random(), f"w{rng.randrange(8)}": 1.0}
        solved = sum(rng.random() < 0.3 for _ in range(8))  # the features say nothing
        if model.ready:
            calibration.add(model.predict(features), solved, 8)
        model.observe(features, solved, 8)
    summary = calibration.summary()
    assert summary["observed"] == pytest.approx(0.3, abs=0.03)
    assert summary["predicted"] == pytest.approx(summary["observed"], abs=0.03)
    best = -(0.3 * math.log(0.3) + 0.7 * math.log(0.7))  # the entropy of the true rate
    assert best - 0.01 < summary["logloss"] < best + 0.03
    for features in ({"x": 2.0}, {"y": 0.9, "w3": 1.0}, {}):
        assert model.predict(features) == pytest.approx(0.3, abs=0.12)


def test_new_features_and_a_one_sided_window_stay_finite():
    model = FeatureSolveModel(window=8, min_groups=1)
    for i in range(20):
        model.observe({f"new{i}": 1.0}, 8, 8)  # always solved, every feature new
    p = model.predict({"new19": 1.0, "never": 5.0})
    assert 0.9 < p < 1.0
    with pytest.raises(ValueError, match="solved"):
        model.observe({}, 9, 8)
    with pytest.raises(ValueError, match="finite"):
        model.observe({"x": math.nan}, 1, 8)
    with pytest.raises(ValueError, match="ridge"):
        FeatureSolveModel(ridge=0)


def test_calibration_summary():
    calibration = Calibration(window=2)
    assert calibration.summary() == {}
    calibration.add(0.9, 0, 4)  # pushed out by the next two
    calibration.add(0.5, 2, 4)
    calibration.add(0.25, 1, 4)
    summary = calibration.summary()
    assert summary["predicted"] == pytest.approx(0.375) and summary["observed"] == pytest.approx(0.375)
    expected = -(2 * math.log(0.5) + 2 * math.log(0.5) + math.log(0.25) + 3 * math.log(0.75)) / 8
    assert summary["logloss"] == pytest.approx(expected)


def test_the_default_hooks_describe_the_prompt_text():
    from atroposlib.environments.arithmetic_server import ArithmeticEnv, ArithmeticEnvConfig
    from atroposlib.envs.base import BaseEnv
    from atroposlib.envs.single_turn import SingleTurnEnv
    from atroposlib.testing.fake_server import FakeServer

    config = ArithmeticEnvConfig(**{**ArithmeticEnv.config_init()[0].model_dump(), "use_wandb": False})
    env = ArithmeticEnv(config, [FakeServer()])
    item = {"a": 7, "op": "+", "b": 15, "answer": 22, "question": "What is 7 + 15?"}
    # a single-turn env: its prompt's text (the answer is not read); any env: the item's JSON
    assert SingleTurnEnv.item_features(env, item) == text_features("What is 7 + 15?")
    assert BaseEnv.item_features(env, item) == text_features(item_text(item))
    assert env.item_features(item)["carries"] == 1.0  # the arithmetic env's own
