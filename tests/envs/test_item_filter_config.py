"""The item filter's settings: the nested ``item_filter`` section, its flags, the earlier flat keys,
and the zero-variance rule as a setting of the one filter."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from atroposlib.env_runtime.command_line import parse_args
from atroposlib.envs.base import BaseEnvConfig
from atroposlib.envs.item_filter import (
    DifficultySettings,
    ItemFilterConfig,
    ItemSampler,
    ZeroVarianceFilter,
    item_key,
)
from tests.fixtures.sample_envs import ChatLengthEnv

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------ the nested config
def test_the_section_has_one_home_for_its_defaults_and_is_frozen():
    config = BaseEnvConfig()
    assert config.item_filter == ItemFilterConfig() and config.item_filter.enabled is False
    assert DifficultySettings is ItemFilterConfig  # the earlier name
    assert not any(name.startswith("difficulty_filter") for name in BaseEnvConfig.model_fields)
    with pytest.raises(ValueError, match="frozen"):
        config.item_filter.floor = 0.5
    with pytest.raises(ValueError, match="solvd_keep"):  # a typo in the section is refused
        BaseEnvConfig(item_filter={"solvd_keep": 0.5})


def test_the_old_flat_keys_move_into_the_section_with_one_log_line_each(caplog):
    from atroposlib.envs import item_filter

    item_filter._warned.discard("difficulty_filter_floor")
    with caplog.at_level(logging.WARNING, logger="atroposlib.envs.item_filter"):
        for _ in range(2):
            config = BaseEnvConfig(difficulty_filter=True, difficulty_filter_floor=0.2,
                                   difficulty_filter_screen_rule="weighted")
    assert config.item_filter == ItemFilterConfig(enabled=True, floor=0.2, screen_rule="weighted")
    assert not config.model_extra  # moved, not kept as undeclared attributes
    lines = [r.getMessage() for r in caplog.records if "'difficulty_filter_floor'" in r.getMessage()]
    assert lines == ["env config key 'difficulty_filter_floor' is deprecated and still accepted: use "
                     "item_filter.floor (--env.item_filter.floor)"]
    # a flat key overrides the same field of a section given beside it, the others stay
    both = BaseEnvConfig(item_filter={"enabled": True, "floor": 0.3, "replay": 0.5},
                         difficulty_filter_floor=0.2)
    assert (both.item_filter.floor, both.item_filter.replay) == (0.2, 0.5)


def test_zero_variance_keep_is_the_zero_variance_preset():
    from atroposlib.envs.multi_turn import MultiTurnEnvConfig

    assert "zero_variance_keep" not in MultiTurnEnvConfig.model_fields
    config = MultiTurnEnvConfig(zero_variance_keep=0.5)
    assert config.item_filter == ItemFilterConfig.zero_variance(0.5)
    assert (config.item_filter.solved_keep, config.item_filter.failed_keep,
            config.item_filter.floor) == (0.5, 0.5, 0.0625)
    assert MultiTurnEnvConfig(zero_variance_keep=1.0).item_filter.enabled is False  # 1.0: off
    with pytest.raises(ValueError, match="zero_variance_keep must be in"):
        MultiTurnEnvConfig(zero_variance_keep=0.0)


# ------------------------------------------------------------------------------ the env command line
class FilteredEnv(ChatLengthEnv):
    """config_init turns the filter on, with a floor of its own."""

    @classmethod
    def config_init(cls):
        config, servers = super().config_init()
        return config.model_copy(update={"item_filter": ItemFilterConfig(enabled=True, floor=0.1)}), servers


@pytest.mark.parametrize("flag", ["--env.item_filter.solved_keep", "--env.item-filter.solved-keep",
                                  "--env.item_filter.solved-keep"])
def test_nested_flags_in_either_spelling(flag):
    _, env, _, _ = parse_args(ChatLengthEnv, ["serve", flag, "0.5", "--env.item_filter.enabled"])
    assert env.item_filter == ItemFilterConfig(enabled=True, solved_keep=0.5)


def test_a_nested_flag_changes_one_field_of_the_layers_below(tmp_path):
    yaml = tmp_path / "c.yaml"
    yaml.write_text("env:\n  item_filter:\n    replay: 0.25\n    failed_keep: 0.4\n")
    _, env, _, _ = parse_args(FilteredEnv, ["process", "--config", str(yaml),
                                            "--env.item_filter.failed_keep", "0.3"])
    # config_init's enabled and floor, YAML's replay, the flag's failed_keep
    assert env.item_filter == ItemFilterConfig(enabled=True, floor=0.1, replay=0.25, failed_keep=0.3)


def test_old_flat_flags_and_yaml_keys_still_work(tmp_path):
    _, env, _, _ = parse_args(ChatLengthEnv, ["serve", "--env.difficulty_filter",
                                              "--env.difficulty-filter-solved-keep", "0.4",
                                              "--env.difficulty_filter_screen", "2"])
    assert env.item_filter == ItemFilterConfig(enabled=True, solved_keep=0.4, screen=2)
    yaml = tmp_path / "c.yaml"
    yaml.write_text("env:\n  difficulty_filter: true\n  difficulty_filter_replay: 0.5\n"
                    "  zero_variance_keep: 0.5\n")
    _, env, _, _ = parse_args(ChatLengthEnv, ["process", "--config", str(yaml),
                                              "--env.difficulty_filter_floor", "0.2"])
    assert env.item_filter == ItemFilterConfig(enabled=True, solved_keep=0.5, failed_keep=0.5,
                                               floor=0.2, replay=0.5)
    _, env, _, _ = parse_args(FilteredEnv, ["serve", "--env.difficulty_filter", "false"])
    assert env.item_filter == ItemFilterConfig(enabled=False, floor=0.1)


def test_an_old_key_returned_by_config_init_still_works():
    class Legacy(ChatLengthEnv):
        @classmethod
        def config_init(cls):
            config, servers = super().config_init()
            values = {**config.model_dump(exclude={"item_filter"}), "difficulty_filter": True,
                      "difficulty_filter_solved_keep": 0.2}
            return BaseEnvConfig(**values), servers

    _, env, _, _ = parse_args(Legacy, ["serve", "--env.item_filter.floor", "0.3"])
    assert env.item_filter == ItemFilterConfig(enabled=True, solved_keep=0.2, floor=0.3)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "tests.fixtures.sample_envs", "ChatLengthEnv", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_help_shows_the_nested_flags_and_config_prints_the_section():
    help_text = _cli("serve", "--help").stdout
    for name in ItemFilterConfig.model_fields:
        assert f"--env.item_filter.{name}" in help_text
    assert "--env.difficulty_filter" not in help_text  # the old spellings are accepted, not shown
    shown = _cli("config", "--json", "--env.item_filter.enabled", "--env.difficulty_filter_floor", "0.2")
    assert shown.returncode == 0, shown.stderr
    section = json.loads(shown.stdout)["env"]["item_filter"]
    assert section == ItemFilterConfig(enabled=True, floor=0.2).model_dump(mode="json")
    assert "deprecated" in shown.stderr  # the one log line for the old key
    bad = _cli("serve", "--env.item_filter.flor", "0.2")
    assert bad.returncode == 2 and "did you mean --env.item_filter.floor?" in bad.stderr
    out_of_range = _cli("serve", "--env.item_filter.floor", "2")
    assert out_of_range.returncode == 2 and "--env.item_filter.floor" in out_of_range.stderr


# ------------------------------------------------------------------------------ the zero-variance rule
class OldZeroVarianceFilter:
    """The zero-variance filter as it was before it became a setting of the item filter.

    An item whose last ``k`` groups were all-same is kept with probability ``keep ** k``
    (``k <= max_streak``), checked with one draw of ``rng`` per item but the last of
    ``max_draws``. Kept here as the reference the one filter must match.
    """

    def __init__(self, keep: float, max_streak: int = 4, max_draws: int = 64):
        self.keep, self.max_streak, self.max_draws = keep, max_streak, max_draws
        self.streaks: dict[str, int] = {}
        self.skipped = 0

    def record(self, item: Any, scores: Sequence[float]) -> None:
        if len(scores) > 1 and max(scores) == min(scores):
            self.streaks[item_key(item)] = min(self.streaks.get(item_key(item), 0) + 1, self.max_streak)
        else:
            self.streaks.pop(item_key(item), None)

    def keep_probability(self, item: Any) -> float:
        return self.keep ** self.streaks.get(item_key(item), 0)

    def next_item(self, draw: Callable[[], Any], rng: random.Random) -> Any:
        item = draw()
        for _ in range(self.max_draws - 1):
            if rng.random() < self.keep_probability(item):
                return item
            self.skipped += 1
            item = draw()
        return item


def _scores(item: dict[str, int], rng: random.Random) -> list[float]:
    """Items 0-3 always come back solved, 4-5 always failed, the rest mixed or not at random."""
    if item["q"] < 4:
        return [1.0] * 4
    if item["q"] < 6:
        return [0.0] * 4
    return [float(rng.random() < 0.5) for _ in range(4)]


def _run(next_item: Callable, record: Callable) -> list[int]:
    """400 items handed out by ``next_item(draw, rng)``, each group's scores fed to ``record``."""
    counter, rng, scores_rng, handed = iter(range(10**6)), random.Random(7), random.Random(3), []

    def draw() -> dict[str, int]:
        return {"q": next(counter) % 10}

    for _ in range(400):
        item = next_item(draw, rng)
        handed.append(item["q"])
        record(item, _scores(item, scores_rng))
    return handed


@pytest.mark.parametrize("keep", [0.5, 0.3, 0.05])
def test_the_zero_variance_preset_makes_the_same_draws_and_skips_as_the_old_filter(keep):
    old = OldZeroVarianceFilter(keep, max_draws=8)
    new = ItemSampler(ItemFilterConfig.zero_variance(keep, max_draws=8))
    handed_old = _run(old.next_item, old.record)
    handed_new = _run(lambda draw, rng: _draw_new(new, draw, rng),
                      lambda item, scores: new.record(item_key(item), scores))
    assert handed_new == handed_old and new.counts["skipped"] == old.skipped > 0
    for q in range(10):  # the same keep probabilities: keep ** streak, floored at keep ** 4
        assert new.weight(item_key({"q": q})) == pytest.approx(old.keep_probability({"q": q}))


def _draw_new(sampler: ItemSampler, draw: Callable[[], Any], rng: random.Random) -> Any:
    """The new sampler's draw loop (as ``ItemSampler.next_item``), with the old filter's ``rng``."""
    for attempt in range(sampler.settings.max_draws):
        item = draw()
        if sampler.accept(item_key(item), attempt, rng):
            return item
    raise AssertionError("the last draw is always accepted")


def test_the_weight_after_k_all_same_groups_is_keep_to_the_k():
    sampler = ItemSampler(ItemFilterConfig.zero_variance(0.3))
    for k in range(1, 8):
        sampler.record("a", [1.0, 1.0] if k % 2 else [0.0, 0.0])  # solved or failed alike
        assert sampler.weight("a") == pytest.approx(0.3 ** min(k, 4))
    sampler.record("a", [1.0, 0.0])
    assert sampler.weight("a") == 1.0


def test_the_zero_variance_filter_alias_keeps_its_interface():
    from atroposlib.envs.prompt_filter import ZeroVarianceFilter as old_path
    from atroposlib.envs.prompt_filter import item_key as old_key

    assert old_path is ZeroVarianceFilter and old_key is item_key
    old, new = OldZeroVarianceFilter(0.5, max_draws=5), ZeroVarianceFilter(0.5, max_draws=5)
    for f in (old, new):
        for _ in range(3):
            f.record({"q": 1}, [1.0, 1.0])
    draws_old, draws_new = [], []
    got_old = old.next_item(lambda: draws_old.append(1) or {"q": 1}, random.Random(11))
    got_new = new.next_item(lambda: draws_new.append(1) or {"q": 1}, random.Random(11))
    assert got_old == got_new and draws_old == draws_new and new.take_skipped() == old.skipped
    assert new.keep_probability({"q": 1}) == old.keep_probability({"q": 1}) == 0.125
