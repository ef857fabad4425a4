"""SingleTurnEnv: the tutorial's example passes check_env; evaluate, train accuracy, checkpoints."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from atroposlib.env_runtime.checks import check_env
from atroposlib.envs.item_filter import ItemFilterConfig
from atroposlib.envs.run_state import RunState
from atroposlib.testing.fake_server import FakeServer
from atroposlib.testing.tiny_tokenizer import make_tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
TUTORIAL = REPO / "docs" / "tutorials" / "write-an-env.md"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_tokenizer_single_turn")
    make_tiny_tokenizer(path)
    return str(path)


EXAMPLE = REPO / "examples" / "add_env.py"


@pytest.fixture(scope="module")
def add_env_cls():
    """The env class of examples/add_env.py, the file the "Write an environment" tutorial shows."""
    text = TUTORIAL.read_text()
    section = text[text.index("## A single-turn env"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert code == EXAMPLE.read_text(), "the tutorial's example and examples/add_env.py differ"
    assert 20 <= len(code.splitlines()) <= 35, "the tutorial's example should stay about 30 lines"
    spec = importlib.util.spec_from_file_location("add_env", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.AddEnv


def _add_reply(req):
    a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", req.prompt)[-1])
    return [str(a + b), f"{a} + {b} = {a + b + 1}", "no idea"][req.index % 3]


def _env(cls, tok_dir, tmp_path, **overrides):
    config, _ = cls.config_init()
    config = cls.env_config_cls(**{**config.model_dump(), "tokenizer_name": tok_dir,
                                   "group_size": 3, "data_dir_to_save_evals": str(tmp_path / "ev"),
                                   **overrides})
    return cls(config, [FakeServer(_add_reply)])


async def test_readme_example_passes_check_env(add_env_cls, tok_dir):
    groups = await check_env(add_env_cls, FakeServer(_add_reply),
                             {"tokenizer_name": tok_dir, "group_size": 3}, num_groups=2)
    for group in groups:
        assert group["scores"] == [1.0, 0.0, 0.0]
        assert group["generation_params"] == {"temperature": 1.0}
        assert group["messages"][0][-1]["role"] == "assistant"


async def test_evaluate_scores_every_eval_item_greedily(add_env_cls, tok_dir, tmp_path):
    env = _env(add_env_cls, tok_dir, tmp_path)
    await env.setup()
    metrics = await env.evaluate()
    # eval requests are n=1, so every reply is choice 0: the right sum
    assert metrics["eval/accuracy"] == 1.0 == metrics["eval/mean_score"]
    assert metrics["eval/num_items"] == 100.0 and metrics["eval/stopped_fraction"] == 1.0
    server = env.server.servers[0]
    assert all(r.kwargs.get("temperature") == 0.0 for r in server.requests)
    samples = [json.loads(x) for x in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 100
    assert samples[0]["answer"] == sum(env.eval_items[0]) and samples[0]["score"] == 1.0
    written = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert written["results"]["all"]["eval/accuracy"] == 1.0


async def test_truncated_reward_replaces_the_score_of_cut_off_replies(add_env_cls, tok_dir, tmp_path):
    cls = type("TruncAdd", (add_env_cls,), {"truncated_reward": -1.0})
    env = _env(cls, tok_dir, tmp_path, max_tokens=1)  # every reply is cut off at 1 token
    await env.setup()
    group, _ = await env.collect_trajectories(await env.get_next_item())
    assert group["scores"] == [-1.0, -1.0, -1.0]
    metrics = await env.evaluate()
    stopped = metrics["eval/stopped_fraction"]  # one-digit sums fit in 1 token and are right
    assert stopped < 0.1 and metrics["eval/accuracy"] == stopped
    assert metrics["eval/mean_score"] == pytest.approx(stopped - (1 - stopped))


async def test_train_accuracy_is_logged_then_reset(add_env_cls, tok_dir, tmp_path, monkeypatch):
    env = _env(add_env_cls, tok_dir, tmp_path)
    await env.setup()
    await env.collect_trajectories(await env.get_next_item())
    seen = {}

    async def fake_base_log(self, metrics=None):
        seen.update(metrics or {})

    monkeypatch.setattr("atroposlib.envs.base.BaseEnv.wandb_log", fake_base_log)
    await env.wandb_log({})
    assert seen["train/percent_correct"] == pytest.approx(1 / 3)
    assert env.train_correct == []


async def test_checkpoint_restores_the_cursor(add_env_cls, tok_dir, tmp_path):
    env = _env(add_env_cls, tok_dir, tmp_path)
    env.bind_run_state(RunState(checkpoint_dir=str(tmp_path / "ck")))
    await env.setup()
    items = [await env.get_next_item() for _ in range(5)]
    env.save_checkpoint(10)
    following = await env.get_next_item()

    resumed = _env(add_env_cls, tok_dir, tmp_path)
    resumed.bind_run_state(RunState(checkpoint_dir=str(tmp_path / "ck"), curr_step=12))
    await resumed.setup()
    resumed.load_checkpoint()
    assert resumed.iter == 5
    assert await resumed.get_next_item() == following
    assert items[0] != following


async def test_missing_hooks_and_items_say_what_to_implement(tok_dir, tmp_path):
    from atroposlib.envs import SingleTurnEnv

    env = _env(SingleTurnEnv, tok_dir, tmp_path)
    with pytest.raises(ValueError, match="train_items"):
        await env.get_next_item()
    with pytest.raises(NotImplementedError, match="prompt"):
        env.prompt({})
    with pytest.raises(NotImplementedError, match="score"):
        env.score({}, "x")


async def test_async_score_runs_concurrently_and_keeps_its_details(add_env_cls, tok_dir, tmp_path,
                                                                   monkeypatch):
    import asyncio

    started, all_started = [], asyncio.Event()

    class SlowJudgeAdd(add_env_cls):
        async def score(self, item, completion):
            # every reply of a group must be in scoring at once before any finishes
            started.append(completion)
            if len(started) == self.config.group_size:
                all_started.set()
            await all_started.wait()
            right = super().score(item, completion)
            return right, {"right": right, "length": len(completion), "note": "kept, not averaged"}

    env = _env(SlowJudgeAdd, tok_dir, tmp_path)
    await env.setup()
    item = await env.get_next_item()
    group, _ = await asyncio.wait_for(env.collect_trajectories(item), timeout=60)
    assert group["scores"] == [1.0, 0.0, 0.0] and len(started) == 3
    seen = {}

    async def fake_base_log(self, metrics=None):
        seen.update(metrics or {})

    monkeypatch.setattr("atroposlib.envs.base.BaseEnv.wandb_log", fake_base_log)
    await env.wandb_log({})
    assert seen["train/right"] == pytest.approx(1 / 3) and "train/note" not in seen
    assert seen["train/length"] > 0 and env.train_details == []

    env.eval_items = env.eval_items[:4]
    all_started.set()
    metrics = await env.evaluate()
    assert metrics["eval/accuracy"] == 1.0 == metrics["eval/right"]
    samples = [json.loads(x) for x in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    assert samples[0]["details"]["note"] == "kept, not averaged"


async def test_a_failing_async_score_counts_the_eval_item_as_failed(add_env_cls, tok_dir, tmp_path):
    class Broken(add_env_cls):
        async def score(self, item, completion):
            if sum(item) % 2:
                raise RuntimeError("judge down")
            return 1.0

    env = _env(Broken, tok_dir, tmp_path)
    await env.setup()
    metrics = await env.evaluate()
    odd = sum(sum(item) % 2 for item in env.eval_items)
    assert metrics["eval/failed_items"] == odd and metrics["eval/num_items"] == 100 - odd


def test_a_score_of_the_wrong_type_says_what_came_back():
    import asyncio

    from atroposlib.envs.scoring import resolve_score

    assert asyncio.run(resolve_score(1)) == (1.0, {})
    with pytest.raises(TypeError, match="number or \\(number, dict of details\\), got 'yes'"):
        asyncio.run(resolve_score("yes"))


async def test_zero_variance_keep_skips_items_whose_groups_all_scored_the_same(add_env_cls, tok_dir,
                                                                            tmp_path):
    """``zero_variance_keep`` (the earlier key) turns on the item filter the process runner applies."""
    from atroposlib.env_runtime.process import run_process

    class TwoItems(add_env_cls):
        async def setup(self):
            self.train_items = [(1, 1), (5, 7)]
            self.rolled = []

        async def collect_trajectories(self, item):
            self.rolled.append(item)
            return await super().collect_trajectories(item)

    def reply(req):  # 1 + 1 is always solved (zero variance); 5 + 7 half the time
        return "2" if "1 + 1" in req.prompt else ["12", "13"][req.index % 2]

    for keep, expect_skips in ((1.0, False), (0.01, True)):
        config = _env(TwoItems, tok_dir, tmp_path, group_size=4, zero_variance_keep=keep, total_steps=20,
                      use_wandb=False, data_path_to_save_groups=str(tmp_path / f"k{keep}.jsonl")).config
        env = TwoItems(config, [FakeServer(reply)])
        await run_process(env, show_progress=False)
        assert env.rolled.count((5, 7)) == 20  # the groups with a signal, all sent
        if not expect_skips:  # off: the items alternate, nothing is counted
            assert env.config.item_filter.enabled is False
            assert env.rolled.count((1, 1)) >= 19 and "difficulty_skipped" not in env.stats
        else:  # keep ** k, k <= 4: after one all-same group 1 + 1 is rarely drawn again
            assert env.config.item_filter == ItemFilterConfig.zero_variance(0.01)
            assert env.rolled.count((1, 1)) <= 2 and env.stats["difficulty_skipped"] > 0
            assert env.stats["difficulty_drawn"] - env.stats["difficulty_skipped"] == len(env.rolled)


def test_zero_variance_filter_streaks_are_capped_and_draws_bounded():
    import random

    from atroposlib.envs.prompt_filter import ZeroVarianceFilter  # the earlier path, an alias

    f = ZeroVarianceFilter(0.5, max_streak=2, max_draws=5)
    for _ in range(4):
        f.record({"q": "solved"}, [1.0, 1.0])
    assert f.keep_probability({"q": "solved"}) == 0.25  # 0.5 ** 2, capped at max_streak
    f.record({"q": "one reply"}, [1.0])  # a single reply is not a zero-variance group
    assert f.keep_probability({"q": "one reply"}) == 1.0
    draws = []
    assert f.next_item(lambda: draws.append(1) or {"q": "solved"}, random.Random(0)) == {"q": "solved"}
    assert len(draws) <= 5 and f.take_skipped() == len(draws) - 1 and f.take_skipped() == 0
    for bad in ({"keep": 0.0}, {"keep": 1.5}, {"keep": 0.5, "max_streak": 0}):
        with pytest.raises(ValueError, match="must be"):
            ZeroVarianceFilter(**bad)


async def test_single_turn_is_the_one_turn_case_of_multi_turn(add_env_cls, tok_dir, tmp_path):
    from pydantic import ValidationError

    from atroposlib.envs.multi_turn import MultiTurnEnv, MultiTurnEnvConfig
    from atroposlib.envs.single_turn import SingleTurnEnv, SingleTurnEnvConfig

    assert issubclass(SingleTurnEnv, MultiTurnEnv) and issubclass(SingleTurnEnvConfig, MultiTurnEnvConfig)
    assert SingleTurnEnvConfig().max_turns == 1
    with pytest.raises(ValidationError, match="max_turns"):
        SingleTurnEnvConfig(max_turns=2)
    env = _env(add_env_cls, tok_dir, tmp_path)
    await env.setup()
    item = await env.get_next_item()
    # what a caller of the multi-turn interface gets: one turn, scored by score()
    episode, score, _ = await env.play_episode(item, temperature=1.0, split="train")
    assert episode.turns == 1 and episode.messages[-1]["role"] == "assistant"
    assert episode.messages[:-1] == env.prompt(item)
    assert score == (1.0 if episode.messages[-1]["content"] == str(sum(item)) else 0.0)
    assert not episode.truncated and any(m != -100 for m in episode.node.masked_tokens)
