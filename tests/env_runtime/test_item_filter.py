"""The item filter: the seeded sampler's weights and draws, the screen, and real serve runs."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from atroposlib.env_runtime.filtering import ItemFilter
from atroposlib.envs.item_filter import (
    ItemFilterConfig,
    ItemSampler,
    SolveRateModel,
    mixed_chance,
    reply_log_odds,
)

SETTINGS = ItemFilterConfig(solved_keep=0.1, failed_keep=0.5, floor=0.05, solved_score=1.0)


def test_weights_follow_the_groups():
    sampler = ItemSampler(SETTINGS)
    assert sampler.weight("new") == 1.0
    assert sampler.record("a", [1.0, 1.0, 1.0]) == "solved"
    assert sampler.weight("a") == pytest.approx(0.1)
    sampler.record("a", [1.0] * 3)
    assert sampler.weight("a") == 0.05  # floored, not 0.01
    assert sampler.record("a", [1.0, 0.0, 1.0]) == "mixed"
    assert sampler.weight("a") == 1.0  # a mixed group restores it
    assert sampler.record("b", [0.0] * 4) == "failed"
    sampler.record("b", [-1.0] * 4)
    assert sampler.weight("b") == pytest.approx(0.25)  # failures are cut gently
    assert sampler.record("c", [1.0]) == "mixed"  # one rollout is never a dropped group
    assert sampler.take_counts() == {"drawn": 0, "skipped": 0, "replayed": 0, "solved": 2, "failed": 2,
                                     "mixed": 2}
    assert sampler.replays == {}  # replay is off by default
    assert sampler.take_counts()["solved"] == 0


def _draws(items):
    cycle = iter(items * 100_000)

    async def draw():
        return next(cycle)
    return draw


async def _hand_out(sampler, items, n):
    draw = _draws(items)
    return [await sampler.next_item(draw, lambda item: item) for _ in range(n)]


async def test_items_are_handed_out_in_proportion_to_their_weights():
    sampler = ItemSampler(SETTINGS, seed=3)
    for _ in range(3):
        sampler.record("solved", [1.0] * 8)  # weight 0.05
    sampler.record("hard", [0.0] * 8)  # weight 0.5
    counts = Counter(await _hand_out(sampler, ["solved", "hard", "open"], 3000))
    # expected shares 0.05 : 0.5 : 1 of 1.55
    assert 0.015 < counts["solved"] / 3000 < 0.06
    assert 0.27 < counts["hard"] / 3000 < 0.38
    assert 0.58 < counts["open"] / 3000 < 0.71
    assert sampler.counts["skipped"] == sampler.counts["drawn"] - 3000


async def test_draws_are_deterministic_for_a_seed():
    def run(seed):
        sampler = ItemSampler(SETTINGS, seed=seed)
        sampler.record("x", [1.0] * 4)
        return asyncio.get_running_loop().create_task(_hand_out(sampler, ["x", "y", "z"], 200))

    first, again, other = await run(7), await run(7), await run(8)
    assert first == again and first != other


async def test_no_item_is_starved_and_the_draw_is_bounded():
    sampler = ItemSampler(ItemFilterConfig(solved_keep=0.1, failed_keep=0.1, floor=0.05,
                                                   solved_score=1.0, max_draws=3))
    for item in ("a", "b"):
        for _ in range(5):
            sampler.record(item, [0.0, 0.0])
    drawn = Counter()
    draw = _draws(["a", "b"])

    async def counting_draw():
        item = await draw()
        drawn[item] += 1
        return item

    out = [await sampler.next_item(counting_draw, lambda i: i) for _ in range(50)]
    assert set(out) == {"a", "b"}  # every item still comes out
    assert sum(drawn.values()) <= 150  # at most max_draws per item handed out

    async def nothing():
        return None
    assert await sampler.next_item(nothing, lambda i: i) is None
    # an item without an id is never filtered
    assert await sampler.next_item(_draws(["a"]), lambda i: None) == "a"


REPLAY = ItemFilterConfig(solved_keep=0.1, failed_keep=0.5, floor=0.05, solved_score=1.0,
                          replay=0.5, replay_size=2, replay_times=3)


def test_mixed_items_are_held_for_replay_by_learnability():
    sampler = ItemSampler(REPLAY)
    sampler.record("half", [1.0, 0.0, 1.0, 0.0], item={"q": "half"})  # p = 0.5: priority 0.25
    sampler.record("rare", [1.0, 0.0, 0.0, 0.0], item={"q": "rare"})  # p = 0.25: 0.1875
    assert sampler.replays["half"].priority == pytest.approx(0.25)
    assert sampler.replays["rare"].priority == pytest.approx(0.1875)
    sampler.record("lower", [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], item="lower")  # 0.109: no room
    assert set(sampler.replays) == {"half", "rare"}
    sampler.record("higher", [1.0, 1.0, 0.0, 0.0, 0.0], item="higher")  # 0.24 evicts "rare"
    assert set(sampler.replays) == {"half", "higher"}
    sampler.record("half", [1.0] * 4)  # solved now: no signal left to replay
    assert set(sampler.replays) == {"higher"}
    sampler.record("one", [0.0], item="one")  # a single rollout has no variance to learn from
    assert "one" not in sampler.replays
    sampler.record("graded", [0.2, 0.6], item="graded")  # any mixed scores: their variance
    assert sampler.replays["graded"].priority == pytest.approx(0.04)


async def test_replays_are_a_share_of_what_is_handed_out_and_end():
    sampler = ItemSampler(REPLAY, seed=5)
    sampler.record("held", [1.0, 0.0], item="held")
    out = await _hand_out(sampler, ["fresh"], 40)
    assert out.count("held") == 3  # replay_times, then it leaves the set
    assert sampler.replays == {} and sampler.counts["replayed"] == 3
    sampler = ItemSampler(REPLAY.model_copy(update={"replay_times": 10_000}), seed=5)
    sampler.record("held", [1.0, 0.0], item="held")
    out = await _hand_out(sampler, ["fresh"], 2000)
    assert 0.45 < out.count("held") / 2000 < 0.55  # the replay share
    sampler = ItemSampler(REPLAY.model_copy(update={"replay": 0.9, "replay_times": 10_000}), seed=5)
    sampler.record("p50", [1.0, 0.0], item="p50")  # priority 0.25
    sampler.record("p25", [1.0, 0.0, 0.0, 0.0], item="p25")  # 0.1875
    counts = Counter(await _hand_out(sampler, ["fresh"], 3000))
    assert 1.15 < counts["p50"] / counts["p25"] < 1.52  # in proportion to priority: 1.33


@pytest.mark.parametrize("bad", [dict(solved_keep=0.0), dict(failed_keep=1.5), dict(floor=0.0),
                                 dict(max_draws=0), dict(replay=1.0), dict(replay=-0.1),
                                 dict(replay_size=0), dict(replay_times=0), dict(screen=0),
                                 dict(screen_window=0), dict(screen_rule="softmax")])
def test_bad_settings_are_refused(bad):
    values = dict(solved_keep=0.1, failed_keep=0.5, floor=0.05, solved_score=1.0) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        ItemFilterConfig(**values)


def test_settings_come_from_the_env_config():
    from atroposlib.envs.base import BaseEnvConfig
    from atroposlib.envs.item_filter import settings_from_config

    assert settings_from_config(BaseEnvConfig()) is None
    on = settings_from_config(BaseEnvConfig(item_filter={"enabled": True, "floor": 0.2}))
    assert on.floor == 0.2 and on.solved_keep == ItemFilterConfig().solved_keep
    assert on.replay == 0.0 and on.screen == 1 and on.screen_rule == "best"
    weighted = settings_from_config(BaseEnvConfig(item_filter=ItemFilterConfig(
        enabled=True, screen=4, screen_rule="weighted", replay=0.5, replay_size=8, replay_times=4)))
    assert (weighted.screen, weighted.screen_rule) == (4, "weighted")
    assert (weighted.replay, weighted.replay_size, weighted.replay_times) == (0.5, 8, 4)
    assert settings_from_config(BaseEnvConfig(item_filter={"floor": 0.2})) is None  # not enabled


# ------------------------------------------------------------------- screening by predicted solve rate
def test_mixed_chance_is_highest_at_even_odds():
    assert mixed_chance(0.5, 8) == pytest.approx(1 - 2 / 256)
    assert mixed_chance(0.0, 8) == mixed_chance(1.0, 8) == 0.0
    assert mixed_chance(0.2, 8) == pytest.approx(mixed_chance(0.8, 8))
    assert mixed_chance(0.3, 8) > mixed_chance(0.1, 8) > mixed_chance(0.01, 8)
    assert mixed_chance(0.5, 1) == 0.0  # a group of one never has two scores


def test_the_prior_predicts_the_reply_probability_itself():
    import math

    model = SolveRateModel()
    for q in (0.001, 0.1, 0.5, 0.9, 0.999):
        assert model.predict(math.log(q)) == pytest.approx(q, rel=1e-6)
    assert reply_log_odds(0.0) > 20  # a certain reply: large and finite
    assert 0.999 < model.predict(0.0) <= 1.0


def test_the_model_learns_the_true_solve_rate_from_groups():
    import math
    import random

    rng = random.Random(0)
    # the truth: solved less often than the exact reply's probability says (a = -1, b = 0.7)
    truth = lambda lp: 1 / (1 + math.exp(-(-1.0 + 0.7 * reply_log_odds(lp))))  # noqa: E731
    model = SolveRateModel(window=256)
    for _ in range(400):
        lp = math.log(rng.uniform(0.01, 0.99))
        solved = sum(rng.random() < truth(lp) for _ in range(8))
        model.observe(lp, solved, 8)
    a, b = model.coef
    assert a == pytest.approx(-1.0, abs=0.25) and b == pytest.approx(0.7, abs=0.2)
    for q in (0.05, 0.3, 0.7, 0.95):
        assert model.predict(math.log(q)) == pytest.approx(truth(math.log(q)), abs=0.06)
    assert len(model.groups) == 256  # only the last window is kept
    with pytest.raises(ValueError, match="solved"):
        model.observe(-1.0, 9, 8)


class ScreenedEnv:
    """Just what the filter uses: items with a known answer log-prob, a config, stats."""

    def __init__(self, logprobs, group_size=8, fail=()):
        import itertools
        from types import SimpleNamespace

        self.config = SimpleNamespace(seed=0, group_size=group_size)
        self.stats = Counter()
        self.items = itertools.cycle(logprobs)
        self.fail = set(fail)
        self.asked = []

    async def get_next_item(self):
        return next(self.items)

    def item_id(self, item):
        return item

    async def answer_logprob(self, item):
        self.asked.append(item)
        if item in self.fail:
            raise RuntimeError("server down")
        return item  # the item is its own log-prob


def _settings(**kw):
    return ItemFilterConfig(solved_keep=0.1, failed_keep=0.5, floor=0.05, solved_score=1.0, **kw)


async def test_screening_hands_out_the_candidate_most_likely_to_come_back_mixed():
    import math

    env = ScreenedEnv([math.log(0.99), math.log(0.01), math.log(0.4), math.log(0.9)])
    screen = ItemFilter(env, _settings(screen=4))
    assert await screen.next_item() == math.log(0.4)  # 0.4 beats 0.9, 0.99 and 0.01
    assert env.asked == [math.log(q) for q in (0.99, 0.01, 0.4, 0.9)]  # one request per candidate
    assert env.stats["difficulty_screened"] == 4
    # the group that comes back refits the model: 0.4's replies were all solved
    screen.note(math.log(0.4), [[1.0] * 8])
    assert screen.model.predict(math.log(0.4)) > 0.4
    assert not screen.signals  # the signal was used once


async def test_the_weighted_rule_draws_candidates_in_proportion_to_their_mixed_chance():
    import math

    solve_rates = (0.99, 0.01, 0.4, 0.9)
    env = ScreenedEnv([math.log(q) for q in solve_rates])
    screen = ItemFilter(env, _settings(screen=4, screen_rule="weighted"))
    draws = 4000
    picked = Counter()
    for _ in range(draws):
        picked[await screen.next_item()] += 1
    chances = {math.log(q): mixed_chance(q, 8) for q in solve_rates}  # the prior predicts q itself
    total = sum(chances.values())
    for signal, chance in chances.items():
        expected = draws * chance / total
        assert abs(picked[signal] - expected) < 4 * math.sqrt(expected) + 1, (signal, picked)
    assert 0 < picked[math.log(0.9)] < picked[math.log(0.4)] < draws  # not always the best


async def test_without_screening_no_answer_is_scored():
    import math

    env = ScreenedEnv([math.log(0.99), math.log(0.4)])
    plain = ItemFilter(env, _settings())
    assert plain.model is None
    assert await plain.next_item() == math.log(0.99)
    assert env.asked == [] and "difficulty_screened" not in env.stats


async def test_a_candidate_whose_answer_cannot_be_scored_ranks_last():
    import math

    good, broken = math.log(0.01), math.log(0.5)
    env = ScreenedEnv([broken, good], fail={broken})
    screen = ItemFilter(env, _settings(screen=2))
    assert await screen.next_item() == good
    assert env.stats["difficulty_screen_failed"] == 1
    every_one_broken = ItemFilter(ScreenedEnv([broken], fail={broken}), _settings(screen=3))
    assert await every_one_broken.next_item() == broken  # the run goes on with the first draw


def test_screening_needs_an_env_that_scores_answers():
    class NoAnswers(ScreenedEnv):
        answer_logprob = None

    with pytest.raises(ValueError, match="item_filter.screen=4 needs an env with answer_logprob"):
        ItemFilter(NoAnswers([0.0]), _settings(screen=4))


# ---------------------------------------------------------------------------- a real serve run
from tests.fixtures.sample_envs import ChatLengthEnv  # noqa: E402

POOL = ["solved 1", "solved 2", "open 1", "open 2"]


class PoolEnv(ChatLengthEnv):
    """Cycles four items: 'solved' ones always score 1 (dropped), 'open' ones by reply length."""

    async def setup(self) -> None:
        self.count = 0
        self.rolled = Counter()

    async def get_next_item(self):
        self.count += 1
        return POOL[self.count % len(POOL)]

    async def collect_trajectories(self, item):
        self.rolled[item] += 1
        group, backlog = await super().collect_trajectories(item)
        if item.startswith("solved"):
            group["scores"] = [1.0] * len(group["scores"])
        return group, backlog


async def _serve(run_api, tiny_tokenizer, tmp_path, enabled: bool, replay: float = 0.0) -> PoolEnv:
    from atroposlib.env_runtime.serve import ServeLoop
    from atroposlib.envs.base import BaseEnvConfig
    from atroposlib.testing.fake_server import FakeServer
    from tests.fixtures.api_server import registered_trainer

    config = BaseEnvConfig(group_size=4, use_wandb=False, rollout_server_url=run_api.url,
                           max_batches_offpolicy=2,
                           item_filter=ItemFilterConfig(enabled=enabled, replay=replay))
    env = PoolEnv(config, [FakeServer(["a", "bb", "ccc", "dddd", "eeeee"])])
    env.tokenizer = tiny_tokenizer
    trainer = await registered_trainer(run_api.url, 8, str(tmp_path))
    stop = asyncio.Event()
    serving = asyncio.create_task(ServeLoop(env, status_interval=0.1, stop_event=stop).run())
    async with asyncio.timeout(90):
        while sum(getattr(env, "rolled", {}).values()) < 120:  # the trainer keeps pulling: the env keeps sampling
            await trainer.get_batch()
            await asyncio.sleep(0.01)
    stop.set()
    await serving
    await trainer.aclose()
    return env


async def test_a_serve_run_samples_solved_items_less(run_api, tiny_tokenizer, tmp_path):
    on = await _serve(run_api, tiny_tokenizer, tmp_path, enabled=True)
    solved_share = sum(n for item, n in on.rolled.items() if item.startswith("solved")) / sum(on.rolled.values())
    # weights 0.05 (after two solved groups) against 1: a few percent, plus the first visits
    assert solved_share < 0.2
    assert on.stats["difficulty_skipped"] > 0 and on.stats["difficulty_solved"] >= 2
    assert on.stats["difficulty_mixed"] > 0


async def test_without_the_filter_every_item_is_sampled_alike(run_api, tiny_tokenizer, tmp_path):
    off = await _serve(run_api, tiny_tokenizer, tmp_path, enabled=False)
    solved_share = sum(n for item, n in off.rolled.items() if item.startswith("solved")) / sum(off.rolled.values())
    assert 0.4 < solved_share < 0.6
    assert "difficulty_skipped" not in off.stats


async def test_a_serve_run_replays_the_items_whose_groups_were_mixed(run_api, tiny_tokenizer, tmp_path):
    env = await _serve(run_api, tiny_tokenizer, tmp_path, enabled=True, replay=0.5)
    assert env.stats["difficulty_replayed"] > 0
    # a replay is handed out without a draw: fewer items drawn than rolled out
    assert env.stats["difficulty_drawn"] - env.stats["difficulty_skipped"] < sum(env.rolled.values())
