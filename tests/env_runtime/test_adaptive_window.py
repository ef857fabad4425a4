"""Serve mode follows the trainer: the off-policy window narrows to run-api's max_staleness."""

from __future__ import annotations

import asyncio
import logging

import pytest

from atroposlib.api.client import AsyncAtroposClient
from atroposlib.api.models import Registration
from atroposlib.env_runtime.pace import PaceTracker, RolloutBudget, smooth
from atroposlib.env_runtime.scheduling import OffpolicyWindow, demand_cap, offpolicy_window
from atroposlib.env_runtime.serve import ServeLoop
from atroposlib.envs.base import BaseEnvConfig
from atroposlib.envs.run_state import RunState
from atroposlib.testing.fake_server import FakeServer
from tests.fixtures.api_server import start_run_api
from tests.fixtures.sample_envs import ChatLengthEnv


def test_window_is_the_envs_own_without_a_staleness_limit():
    assert offpolicy_window(3, None, latency=5.0, step_interval=1.0) == OffpolicyWindow(3, 0, None)
    assert offpolicy_window(0, None).batches is None  # disabled, and nothing else limits it


def test_window_leaves_room_for_the_steps_a_rollout_takes():
    # 2.5 s rollouts, a step per second: 3 steps pass while one runs; 5 - 3 = 2 batches
    assert offpolicy_window(3, 5, latency=2.5, step_interval=1.0) == OffpolicyWindow(2, 3, 2)
    assert offpolicy_window(3, 10, latency=2.5, step_interval=1.0).batches == 3  # own window binds
    assert offpolicy_window(-1, 5, latency=2.5, step_interval=1.0).batches == 2  # the limit alone
    # latency or step interval not measured yet: the limit without the lag
    assert offpolicy_window(3, 2).batches == 2
    assert offpolicy_window(3, 2, latency=9.0).batches == 2
    assert offpolicy_window(3, 2, latency=9.0, step_interval=0.0).batches == 2


def test_window_never_goes_below_one_batch_and_says_so():
    window = offpolicy_window(3, 1, latency=2.0, step_interval=0.5)
    assert window == OffpolicyWindow(1, 4, -3) and window.too_small
    assert not offpolicy_window(3, 5, latency=2.0, step_interval=0.5).too_small  # 5 - 4 = 1 batch
    assert not offpolicy_window(3, None).too_small


def test_demand_cap_is_littles_law_with_headroom():
    # 2 groups per step, every rollout usable, 4 s rollouts, 1 step/s: 8 in flight, x1.5 = 12
    assert demand_cap(2, 4.0, 1.0, [1, 1]) == 12
    # one rollout in four gives a usable group: four times as many rollouts
    assert demand_cap(2, 4.0, 1.0, [1, 0, 0, 0]) == 48
    assert demand_cap(2, 4.0, 1.0, [], headroom=1.0) == 8  # yield unknown: 1
    assert demand_cap(2, 4.0, 1.0, [0] * 8, min_yield=0.5) == 24  # yield floor
    assert demand_cap(1, 0.01, 10.0, [1]) == 1  # never below one rollout
    assert demand_cap(2, None, 1.0, [1]) is None and demand_cap(2, 4.0, None, [1]) is None


def test_pace_tracker_smooths_step_intervals_and_latencies():
    pace = PaceTracker(weight=0.5)
    pace.note_step(3, now=100.0)  # first sight: no change yet
    pace.note_step(4, now=105.0)  # first change: starts the clock (start-up not counted)
    assert pace.step_interval is None
    pace.note_step(4, now=106.0)  # unchanged
    pace.note_step(6, now=109.0)  # 2 steps in 4 s
    assert pace.step_interval == 2.0
    pace.note_step(7, now=113.0)
    assert pace.step_interval == smooth(2.0, 4.0, 0.5) == 3.0
    pace.note_step(2, now=120.0)  # a trainer restarted from a checkpoint: the clock restarts
    pace.note_step(3, now=121.0)
    assert pace.step_interval == 2.0
    pace.note_rollout(4.0)
    pace.note_rollout(2.0)
    assert pace.latency == 3.0
    with pytest.raises(ValueError, match="smoothing weight"):
        PaceTracker(weight=0.0)


def test_automatic_cap_follows_demand_and_a_user_cap_is_hard():
    def loop_with(max_num_workers: int) -> ServeLoop:
        config = BaseEnvConfig(group_size=4, use_wandb=False, max_num_workers=max_num_workers,
                               max_batches_offpolicy=3)
        loop = ServeLoop(ChatLengthEnv(config, [FakeServer()]))
        loop.state.batch_size = 32  # 8 groups per step; window 3 batches = 24 groups
        loop.status = {"current_step": 0, "queue_size": 0, "unallocated_fraction": 1.0}
        loop.pace.latency, loop.pace.step_interval = 2.0, 1.0
        return loop

    auto = loop_with(-1)
    assert auto.env.max_num_workers == 8  # the per-server default
    assert auto.worker_cap() == 24  # demand 8 x 2 x 1.5 = 24 > 8; the window allows 24
    auto.pace.latency = 10.0
    assert auto.worker_cap() == 24  # demand 120: the window binds
    auto.pace.latency = 0.1
    assert auto.worker_cap() == 8  # little demand: the per-server default stays the floor
    assert loop_with(6).worker_cap() == 6  # set by the user: a hard cap
    report = auto.pace_report()
    assert report == {"rollout_cap": 8.0, "offpolicy_window_batches": 3.0, "rollout_latency_s": 0.1,
                      "step_interval_s": 1.0}


async def _paced_trainer(url: str, tmp_path, pull_every: float, stop: asyncio.Event) -> int:
    """A trainer (max_staleness=1) asking for a batch every ``pull_every`` s; returns batches."""
    client = AsyncAtroposClient(url)
    await client.register(Registration(
        wandb_group="g", wandb_project="p", batch_size=8, max_token_len=512,
        checkpoint_dir=str(tmp_path), save_checkpoint_interval=-1, starting_step=0, num_steps=1000,
        max_staleness=1,
    ))
    batches = 0
    try:
        while not stop.is_set():
            if await client.get_batch():
                batches += 1
            await asyncio.sleep(pull_every)
    finally:
        await client.aclose()
    return batches


class FixedWindowBudget(RolloutBudget):
    """The budget before it followed the trainer: max_batches_offpolicy whatever the limit."""

    def window(self, status) -> OffpolicyWindow:
        return OffpolicyWindow(self.config.max_batches_offpolicy if status else None, 0, None)


class FixedWindowLoop(ServeLoop):
    """The loop before it followed the trainer."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.budget = FixedWindowBudget(self.env, self.state)


async def _stale_drops(loop_cls, tiny_tokenizer, tmp_path,
                       seconds: float) -> tuple[int, int, ServeLoop]:
    """Serve for ``seconds`` with 0.5 s rollouts to a trainer pulling every 0.2 s (max_staleness=1).

    Each run gets its own run-api. Returns (groups dropped as stale, batches served, the loop).
    """
    run_api = start_run_api()
    try:
        return await _serve_against(loop_cls, run_api, tiny_tokenizer, tmp_path, seconds)
    finally:
        run_api.stop()


async def _serve_against(loop_cls, run_api, tiny_tokenizer, tmp_path, seconds):
    stop = asyncio.Event()
    trainer = asyncio.create_task(_paced_trainer(run_api.url, tmp_path, 0.2, stop))
    await asyncio.sleep(0.3)  # registered
    config = BaseEnvConfig(group_size=4, use_wandb=False, rollout_server_url=run_api.url,
                           max_batches_offpolicy=3)  # the default window; max_num_workers automatic
    env = ChatLengthEnv(config, [FakeServer(latency=0.5)])
    env.tokenizer = tiny_tokenizer
    loop = loop_cls(env, status_interval=0.1)
    serving = asyncio.create_task(loop.run())
    await asyncio.sleep(seconds)
    loop.stop_event.set()
    await serving
    stop.set()
    batches = await trainer
    client = AsyncAtroposClient(run_api.url)
    try:
        status = await client.status()
    finally:
        await client.aclose()
    assert status["max_staleness"] == 1
    return status["stale_groups_dropped"].get(str(env.env_id), 0), batches, loop


async def test_following_the_staleness_limit_stops_stale_drops(tiny_tokenizer, tmp_path, caplog):
    """The same env, trainer and settings: the fixed window loses groups to staleness, the
    adaptive one none, and it says once why it cannot sample further ahead."""
    caplog.set_level(logging.INFO, logger="atroposlib.env_runtime.serve")
    fixed, fixed_batches, _ = await _stale_drops(FixedWindowLoop, tiny_tokenizer, tmp_path, 8.0)
    assert fixed > 0 and fixed_batches > 0

    adaptive, batches, loop = await _stale_drops(ServeLoop, tiny_tokenizer, tmp_path, 8.0)
    assert adaptive == 0, (adaptive, fixed)
    assert batches > 0
    assert loop.pace.latency == pytest.approx(0.5, abs=0.2) and loop.pace.step_interval is not None
    window = loop.window()
    assert window.batches == 1 and window.too_small  # 1 - ceil(0.5 / step interval) < 1
    warnings = [r.getMessage() for r in caplog.records
                if "leaves less than one batch" in r.getMessage()]
    assert len(warnings) == 1 and "max_staleness=1" in warnings[0] and "at least" in warnings[0]
    loop.log_progress(every=0.0)
    assert "window 1 batch(es), rollout ~0." in caplog.text


def test_follow_trainer_pace_false_keeps_the_window_and_cap_as_set(tiny_tokenizer):
    """The switch the benchmark compares against: max_batches_offpolicy and the per-server cap."""
    config = BaseEnvConfig(group_size=4, use_wandb=False, max_batches_offpolicy=3,
                           follow_trainer_pace=False)
    env = ChatLengthEnv(config, [FakeServer()])
    budget = RolloutBudget(env, RunState.for_config(config, batch_size=8))
    budget.pace.latency, budget.pace.step_interval = 10.0, 1.0  # would narrow to 1 and raise demand
    status = {"max_staleness": 1, "queue_size": 0}
    assert budget.window(status).batches == 3 and not budget.window(status).too_small
    # the room of 3 batches (3 x 8 / 4 = 6 groups) under the per-server 8, no demand raise
    assert budget.cap(status, 0) == 6
    budget.config = config.model_copy(update={"follow_trainer_pace": True})
    assert budget.window(status).batches == 1 and budget.cap(status, 0) == 2  # narrowed: 1 x 8 / 4
