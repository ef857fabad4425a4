"""The item filter's screen with the free signal (``screen_signal="features"``), and a real serve run."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from types import SimpleNamespace

from atroposlib.env_runtime.filtering import ItemFilter
from atroposlib.envs.item_filter import ItemFilterConfig


def _settings(**kw):
    return ItemFilterConfig(enabled=True, screen_signal="features", **kw)


class FeatureEnv:
    """Just what the filter uses: distinct items whose ``kind`` decides their groups, no answer_logprob."""

    def __init__(self, kinds=("solved", "failed", "open"), group_size=8):
        self.config = SimpleNamespace(seed=0, group_size=group_size)
        self.stats = Counter()
        self.numbers = itertools.count()
        self.kinds = itertools.cycle(kinds)

    async def get_next_item(self):
        return {"n": next(self.numbers), "kind": next(self.kinds)}

    def item_id(self, item):
        return item["n"]

    def item_features(self, item):
        return {"solved": float(item["kind"] == "solved"), "failed": float(item["kind"] == "failed")}


def _group(item, size=8):
    return {"solved": [1.0] * size, "failed": [0.0] * size}.get(item["kind"], [1.0, 0.0] * (size // 2))


async def test_the_feature_screen_teaches_itself_then_skips_the_predicted_all_same_items():
    env = FeatureEnv()
    screen = ItemFilter(env, _settings(screen=3, screen_min_groups=12))
    handed = []
    for _ in range(60):
        item = await screen.next_item()
        handed.append(item["kind"])
        screen.note(item, [_group(item)])
    # warm-up: one item drawn per item handed out, in the env's own order, none screened
    assert handed[:12] == ["solved", "failed", "open"] * 4
    assert env.stats["difficulty_screen_warmup"] == 12
    assert env.stats["difficulty_screened"] == 3 * 48
    # then each screen of one of each kind hands out the open one
    assert handed[12:] == ["open"] * 48
    # open items are coin flips: the best a model can score on them is log 2 per rollout
    assert abs(env.stats["difficulty_screen_logloss"] - 0.6931) < 0.02
    assert env.stats["difficulty_screen_observed"] == 0.5  # only open items since the warm-up
    assert abs(env.stats["difficulty_screen_predicted"] - 0.5) < 0.1
    assert not screen.signals  # every signal was used by its group


async def test_an_env_without_item_features_is_described_by_its_text():
    class TextEnv(FeatureEnv):
        item_features = None

        async def get_next_item(self):
            item = await super().get_next_item()
            return f"{item['kind']} problem {item['n']}"

        def item_id(self, item):
            return item

    env = TextEnv()
    screen = ItemFilter(env, _settings(screen=3, screen_min_groups=12))
    handed = []
    for _ in range(45):
        item = await screen.next_item()
        handed.append(item.split()[0])
        screen.note(item, [_group({"kind": item.split()[0]})])
    assert Counter(handed[12:])["open"] >= 30  # of 33, learned from the words alone


async def test_a_failing_featurizer_ranks_its_candidate_last_and_the_run_goes_on():
    class Broken(FeatureEnv):
        def item_features(self, item):
            if item["kind"] == "open":
                return {"bad": float("nan")}
            return None if item["kind"] == "failed" else super().item_features(item)

    env = Broken(kinds=("open", "failed", "solved"))
    screen = ItemFilter(env, _settings(screen=3, screen_min_groups=1))
    first = await screen.next_item()  # warm-up: handed out, but nothing learned from it
    screen.note(first, [_group(first)])
    assert first["kind"] == "open" and screen.model.seen == 0
    assert env.stats["difficulty_screen_failed"] == 1
    item = await screen.next_item()  # still warming up: a None signal teaches nothing either
    screen.note(item, [_group(item)])
    item = await screen.next_item()
    screen.note(item, [_group(item)])
    assert screen.model.seen == 1
    assert (await screen.next_item())["kind"] == "solved"  # the only candidate with features


def test_the_feature_screen_needs_no_answer_logprob():
    screen = ItemFilter(FeatureEnv(), _settings(screen=8))
    assert type(screen.model).__name__ == "FeatureSolveModel" and not screen.model.ready


# ---------------------------------------------------------------------------- a real serve run
from tests.fixtures.sample_envs import ChatLengthEnv  # noqa: E402


class DistinctEnv(ChatLengthEnv):
    """Never the same item twice: 'solved N' always scores 5 (dropped), 'open N' by reply length (1-5)."""

    async def setup(self) -> None:
        self.count = 0
        self.rolled: list[str] = []

    async def get_next_item(self):
        self.count += 1
        return f"{'solved' if self.count % 2 else 'open'} {self.count}"

    async def collect_trajectories(self, item):
        self.rolled.append(item.split()[0])
        group, backlog = await super().collect_trajectories(item)
        if item.startswith("solved"):
            group["scores"] = [5.0] * len(group["scores"])
        return group, backlog


async def test_a_serve_run_learns_which_new_items_come_out_all_same(run_api, tiny_tokenizer, tmp_path):
    from atroposlib.env_runtime.serve import ServeLoop
    from atroposlib.envs.base import BaseEnvConfig
    from atroposlib.testing.fake_server import FakeServer
    from tests.fixtures.api_server import registered_trainer

    config = BaseEnvConfig(group_size=4, use_wandb=False, rollout_server_url=run_api.url,
                           max_batches_offpolicy=2,
                           item_filter=_settings(screen=4, screen_min_groups=16, solved_score=3.0))
    env = DistinctEnv(config, [FakeServer(["a", "bb", "ccc", "dddd", "eeeee"])])
    env.tokenizer = tiny_tokenizer
    trainer = await registered_trainer(run_api.url, 8, str(tmp_path))
    stop = asyncio.Event()
    serving = asyncio.create_task(ServeLoop(env, status_interval=0.1, stop_event=stop).run())
    async with asyncio.timeout(90):
        while len(getattr(env, "rolled", [])) < 100:
            await trainer.get_batch()
            await asyncio.sleep(0.01)
    stop.set()
    await serving
    await trainer.aclose()
    # items never recur, so the per-item weights cannot help: the features do
    assert env.stats["difficulty_skipped"] == 0
    assert env.stats["difficulty_screen_warmup"] >= 16
    after = env.rolled[40:]  # well past the warm-up (groups finish out of order)
    assert after.count("solved") / len(after) < 0.15
    assert env.stats["difficulty_screened"] > 0
    # calibrated: the open items' share of replies scoring >= 3 is predicted within a few points
    assert abs(env.stats["difficulty_screen_predicted"] - env.stats["difficulty_screen_observed"]) < 0.1
    assert env.stats["difficulty_screen_logloss"] < 0.8  # their entropy is about 0.67


async def test_the_arithmetic_env_screens_by_its_problem_features_as_the_benchmark_builds_it():
    """The benchmark's 'on' arm with the free screen: problems with one carry (or borrow) come
    back mixed, none all solved, two all failed; after the warm-up the screen hands out the mixed kind."""
    from atroposlib.environments.arithmetic_server import ArithmeticEnv, column_carries
    from atroposlib.envs.item_features import FeatureSolveModel
    from atroposlib.testing.fake_server import FakeServer
    from atroposlib.utils.flags import merge_sections
    from tests.fixtures.bench_scripts import load_bench

    overrides = load_bench("bench_difficulty_filter.py").arm_overrides(
        "on", ["item_filter.screen=8", "item_filter.screen_signal=features",
               "item_filter.screen_min_groups=30"], [])
    config, _ = ArithmeticEnv.config_init()
    values = merge_sections(config.model_dump(), {"difficulty": 4, "group_size": 8, "use_wandb": False,
                                                  "item_filter": {"enabled": True}}, type(config))
    env = ArithmeticEnv(type(config)(**merge_sections(values, overrides, type(config))), [FakeServer()])
    await env.setup()
    screen = ItemFilter.for_env(env)
    assert isinstance(screen.model, FeatureSolveModel)
    carries = []
    for _ in range(100):
        item = await screen.next_item()
        carried = column_carries(item["a"], item["op"], item["b"])
        carries.append(carried)
        screen.note(item, [[1.0] * 8 if carried == 0 else [0.0] * 8 if carried > 1 else [1.0, 0.0] * 4])
    assert env.stats["difficulty_screen_warmup"] == 30 and env.stats["difficulty_screened"] == 8 * 70
    assert carries[30:].count(1) >= 65  # of 70; unscreened, 43% of the problems carry once
