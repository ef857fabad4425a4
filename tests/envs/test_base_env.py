"""BaseEnv machinery: group validation and drop counters, aggregation, process loop, checkpoints, wandb."""

from __future__ import annotations

import json

import pytest

from atroposlib.env_runtime.serve import inflight_cap, offpolicy_room
from atroposlib.env_runtime.sinks import WandbSink
from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.groups import aggregate_items
from atroposlib.envs.run_state import RunState
from atroposlib.errors import RolloutError
from atroposlib.testing.fake_server import FakeServer
from tests.fixtures.sample_envs import ChatLengthEnv, SingleRolloutEnv


def _env(tokenizer, **overrides) -> BaseEnv:
    config = BaseEnvConfig(**{"group_size": 2, "use_wandb": False, **overrides})
    env = ChatLengthEnv(config, [FakeServer()])
    env.tokenizer = tokenizer
    return env


def _bind(env: BaseEnv, **values) -> RunState:
    """Bind a run state as a runner would (the env's run attributes are read-only)."""
    state = RunState.for_config(env.config, **values)
    env.bind_run_state(state)
    return state


def _group(scores=(1.0, 0.0), length=3, **extra) -> ScoredDataGroup:
    return ScoredDataGroup(
        tokens=[[5] * length for _ in scores], masks=[[-100] + [5] * (length - 1) for _ in scores],
        scores=list(scores), **extra,
    )


def test_groups_are_validated_dropped_and_counted(tiny_tokenizer):
    env = _env(tiny_tokenizer)
    _bind(env, max_seq_len=10)
    bad_masks = _group()
    bad_masks["masks"][1] = [1]
    accepted = env._accept_groups([
        _group(),                                # ok
        _group(scores=(1.0, 1.0)),               # identical scores
        _group(scores=(1.0, 0.0, 0.5)),          # wrong size
        bad_masks,                               # shape mismatch
        _group(length=10),                       # >= max_seq_len
        None,                                    # skipped silently
        _group(scores=(1.0, 0.5, 0.0), group_overrides={"group_size": 3}),  # variable size ok
        _group(group_overrides=None),            # explicit None (crashed upstream)
    ])
    assert len(accepted) == 3
    assert dict(env.stats) == {
        "groups_accepted": 3, "groups_dropped_same_scores": 1, "groups_dropped_wrong_size": 1,
        "groups_dropped_invalid": 1, "groups_dropped_too_long": 1,
    }
    for group in accepted:
        assert group["ref_logprobs"] is None and group["distill_logprobs"] is None
        assert group["messages"] is None  # include_messages is off


def test_identical_scores_kept_when_not_ensured_and_messages_synthesised(tiny_tokenizer):
    env = _env(tiny_tokenizer, ensure_scores_are_not_same=False, include_messages=True)
    group = _group(scores=(0.0, 0.0))
    group["tokens"] = [tiny_tokenizer.encode("abc")] * 2
    group["masks"] = [[-100, 98, 99]] * 2
    [accepted] = env._accept_groups(group)
    assert accepted["messages"][0] == [{"role": "user", "content": "abc"}]


def test_default_aggregation_rejects_partially_set_fields():
    items = [
        {"tokens": [1, 2], "masks": [-100, 2], "scores": 1.0, "inference_logprobs": [1.0, -0.1]},
        {"tokens": [1, 3], "masks": [-100, 3], "scores": 0.0},
    ]
    with pytest.raises(RolloutError, match="inference_logprobs"):
        aggregate_items(items)
    items[1]["inference_logprobs"] = [1.0, -0.2]
    items[0]["group_overrides"] = {"temperature": 0.7}
    group = aggregate_items(items)
    assert group["inference_logprobs"] == [[1.0, -0.1], [1.0, -0.2]]
    assert group["group_overrides"] == {"temperature": 0.7}
    assert group["advantages"] is None


async def test_process_counts_failures_and_still_produces_total_steps_groups(tiny_tokenizer, tmp_path):
    class Flaky(SingleRolloutEnv):
        async def collect_trajectories(self, item):
            if item % 2 == 0:
                raise KeyError("reward crashed")
            return await super().collect_trajectories(item)

    path = tmp_path / "groups.jsonl"
    config = BaseEnvConfig(group_size=2, use_wandb=False, total_steps=3, include_messages=True,
                           ensure_scores_are_not_same=False,
                           data_path_to_save_groups=str(path))
    env = Flaky(config, [FakeServer()])
    env.tokenizer = tiny_tokenizer
    assert await env.process_manager(show_progress=False) == path
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    assert env.stats["groups_dropped_error"] == 2, dict(env.stats)  # items 2, 4 failed
    assert all(json.loads(line)["inference_logprobs"] for line in lines)
    assert path.with_suffix(".html").exists()


def test_checkpoint_roundtrip_uses_newest_at_or_before_step(tiny_tokenizer, tmp_path):
    env = _env(tiny_tokenizer)
    _bind(env, checkpoint_dir=str(tmp_path), wandb_prepend="chat_length_0")
    env.save_checkpoint(10, {"iter": 10})
    env.save_checkpoint(20, {"iter": 20})
    env.save_checkpoint(30)  # no data: nothing written
    fresh = _env(tiny_tokenizer)
    _bind(fresh, checkpoint_dir=str(tmp_path), wandb_prepend="chat_length_0", curr_step=25)
    fresh.load_checkpoint()
    assert fresh.iter == 20  # upstream needed an exact step match
    assert not (tmp_path / "env_checkpoints" / "chat_length_0" / "step-30.json").exists()


def test_offpolicy_room():
    status = {"queue_size": 2, "unallocated_fraction": 1.0, "self_queue_size": 2, "max_group_size": 4}
    # 3 batches x 16 sequences / group 4 = 12 groups allowed; 2 queued, 1 unsent -> 9
    assert offpolicy_room(status, 16, 4, 3, None, unsent_groups=1) == 9
    assert offpolicy_room(status, 16, 4, 0, None) is None  # disabled
    assert offpolicy_room(status, -1, 4, 3, None) is None  # batch size unknown
    full = {**status, "queue_size": 20}
    assert offpolicy_room(full, 16, 4, 3, None) < 0
    # A reserved share of every batch keeps a floor even when the queue is full of others' data.
    assert offpolicy_room({**full, "self_queue_size": 0, "unallocated_fraction": 0.5}, 16, 4, 3, 0.5) > 0


def test_inflight_cap_counts_rollouts_by_their_recent_yield():
    assert inflight_cap(4, []) == 4  # nothing known yet: one group per rollout, as before
    assert inflight_cap(4, [1] * 10) == 4
    assert inflight_cap(4, [1, 0, 0, 0]) == 16  # 3 in 4 dropped: 4 rollouts make one group
    assert inflight_cap(4, [0] * 32) == 32  # floor of 1/8 group a rollout: at most 8x the room
    assert inflight_cap(4, [2, 2]) == 4  # a rollout giving 2 groups keeps the old bound
    assert inflight_cap(3, [1, 0]) == 6
    assert inflight_cap(0, [0, 0]) == 0 and inflight_cap(-2, [1]) == 0  # a full window stays full


async def test_wandb_logging_offline(tiny_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    env = _env(tiny_tokenizer, use_wandb=True)
    sink = WandbSink(env)
    _bind(env, sinks=[sink])
    sink.start(project="atroposlib-tests")
    try:
        await env.handle_send_to_api(_group(), do_send_to_api=False)
        await env.wandb_log({"custom/metric": 1.5})
        summary = dict(wandb.run.summary)
        assert summary["custom/metric"] == 1.5
        assert summary["train/completion_lengths"] == 2
        assert summary["train/groups_accepted"] == 1
        assert any(k.startswith("server/server_0_") for k in summary)
        assert "train/rollouts" in summary  # the rollout table was logged
    finally:
        await sink.close()
    assert wandb.run is None


async def test_process_without_total_steps_runs_until_items_run_out(tiny_tokenizer):
    class Finite(SingleRolloutEnv):
        async def get_next_item(self):
            item = await super().get_next_item()
            return item if item <= 3 else None

    config = BaseEnvConfig(group_size=2, use_wandb=False, total_steps=-1,
                           ensure_scores_are_not_same=False)
    env = Finite(config, [FakeServer()])
    env.tokenizer = tiny_tokenizer
    await env.process_manager(show_progress=False)
    assert env.stats["groups_accepted"] == 3


async def test_process_stops_with_an_error_when_every_item_fails(tiny_tokenizer, tmp_path):
    class AlwaysFails(SingleRolloutEnv):
        async def collect_trajectories(self, item):
            raise KeyError("reward crashed")

    path = tmp_path / "groups.jsonl"
    config = BaseEnvConfig(group_size=2, use_wandb=False, total_steps=3,
                           max_consecutive_failures=5, data_path_to_save_groups=str(path))
    env = AlwaysFails(config, [FakeServer()])
    env.tokenizer = tiny_tokenizer
    with pytest.raises(RolloutError, match="5 items in a row"):
        await env.process_manager(show_progress=False)
    assert env.stats["groups_dropped_error"] == 5, dict(env.stats)
