"""The runner step ``run_item`` (one outcome per item) and the run state / frozen config contract."""

from __future__ import annotations

import httpx
import pytest

from atroposlib.env_runtime import Outcome, ServeLoop, Skip, run_item, start_run
from atroposlib.envs.base import BaseEnv, BaseEnvConfig, FrozenConfigError, ScoredDataGroup
from atroposlib.envs.run_state import RunState
from atroposlib.errors import InferenceUnavailableError
from atroposlib.testing.fake_server import FakeServer


class ScriptedEnv(BaseEnv):
    """``item`` names what collect_trajectories does: a score list, or an exception to raise."""

    async def get_next_item(self):
        return None

    async def collect_trajectories(self, item):
        if isinstance(item, BaseException):
            raise item
        group = ScoredDataGroup(tokens=[[1, 2, 3] for _ in item], masks=[[-100, 2, 3] for _ in item],
                                scores=list(item))
        return group, ["later"]

    async def evaluate(self, *args, **kwargs):
        return {}


def _env(**overrides) -> ScriptedEnv:
    return ScriptedEnv(BaseEnvConfig(**{"group_size": 2, "use_wandb": False, **overrides}), [FakeServer()])


async def test_a_scored_group_is_the_outcome_with_its_backlog():
    env = _env()
    outcome = await run_item(env, [1.0, 0.0])
    assert isinstance(outcome, Outcome) and outcome.reason is None and outcome.error is None
    assert outcome.group["scores"] == [1.0, 0.0] and outcome.backlog == ["later"]
    assert len(env.task_durations) == 1 and not env.stats


async def test_an_env_exception_is_classified_counted_and_not_raised():
    env = _env()
    outcome = await run_item(env, KeyError("reward crashed"))
    assert outcome.reason is Skip.ERROR and isinstance(outcome.error, KeyError)
    assert outcome.group is None and env.stats["groups_dropped_error"] == 1
    unreachable = await run_item(env, httpx.ConnectError("inference down"))
    assert unreachable.reason is Skip.INFERENCE  # infrastructure, not the rollout: retry it
    assert (await run_item(env, InferenceUnavailableError("no server"))).reason is Skip.INFERENCE
    assert env.stats["rollouts_failed_inference"] == 2


async def test_identical_scores_are_skipped_unless_allowed():
    env = _env()
    outcome = await run_item(env, [0.5, 0.5])
    assert outcome.reason is Skip.SAME_SCORES and outcome.groups == []
    assert outcome.dropped[0][0] is Skip.SAME_SCORES and env.stats["groups_dropped_same_scores"] == 1
    assert (await run_item(_env(ensure_scores_are_not_same=False), [0.5, 0.5])).reason is None
    assert (await run_item(env, [0.5, 0.5], validate=False)).groups  # check_env's own checks


async def test_wrong_size_none_and_too_long_are_skip_reasons():
    env = _env()
    assert (await run_item(env, [1.0, 0.0, 0.5])).reason is Skip.WRONG_SIZE
    env.bind_run_state(RunState(max_seq_len=3))
    assert (await run_item(env, [1.0, 0.0])).reason is Skip.TOO_LONG
    assert (await run_item(env, [1.0, 0.0], check_length=False)).reason is None

    class Declines(ScriptedEnv):
        async def collect_trajectories(self, item):
            return None, []

    declines = Declines(BaseEnvConfig(group_size=2, use_wandb=False), [FakeServer()])
    assert (await run_item(declines, 1)).reason is Skip.RETURNED_NONE


def test_config_is_writable_until_a_runner_starts_then_read_only():
    env = _env()
    env.config.group_size = 4  # an env's own __init__/setup code may still adjust it
    start_run(env)
    with pytest.raises(FrozenConfigError, match="read-only once a runner has started"):
        env.config.group_size = 8
    assert env.config.group_size == 4
    copy = env.config.model_copy(update={"group_size": 6})
    copy.group_size = 2  # a copy is a new, unfrozen config


def test_run_attributes_are_read_only_views_of_the_runners_state():
    env = _env(batch_size=8, rollout_server_url="http://127.0.0.1:9")
    loop = ServeLoop(env)  # binds its RunState and freezes the config
    loop.state.curr_step, loop.state.max_seq_len = 7, 64
    assert (env.curr_step, env.max_token_len, env.run_state.batch_size) == (7, 64, 8)
    with pytest.raises(AttributeError, match="read-only: the runner owns it"):
        env.curr_step = 8
    with pytest.raises(AttributeError, match="owned by the runner"):
        env.run_state.total_steps = 3
    with pytest.raises(FrozenConfigError):
        env.config.batch_size = 16


class _CountingCheck:
    """Counts how often the env side checks a group (every check runs ``group_shape_error``)."""

    def __init__(self, monkeypatch):
        import atroposlib.envs.groups as groups

        self.calls = 0
        real = groups.group_shape_error

        def counted(group):
            self.calls += 1
            return real(group)

        monkeypatch.setattr(groups, "group_shape_error", counted)


async def _serve_items(env, items) -> list:
    """Run ``items`` through serve mode's worker (run_item -> handle_send_to_api -> outbox)."""
    loop = ServeLoop(env)
    for item in items:
        await loop._worker(item)
    queue = loop.state.outbox.queue
    return [queue.get_nowait() for _ in range(queue.qsize())]


async def test_serve_checks_each_group_once(monkeypatch):
    check = _CountingCheck(monkeypatch)
    env = _env(rollout_server_url="http://127.0.0.1:9")
    sent = await _serve_items(env, [[1.0, 0.0], [0.5, 0.5], [1.0, 0.0, 1.0], [0.0, 1.0]])
    assert [g["scores"] for g in sent] == [[1.0, 0.0], [0.0, 1.0]]  # same-score and wrong-size dropped
    assert check.calls == 4  # one check per group, not one in run_item and one in handle_send_to_api
    assert env.stats["groups_dropped_same_scores"] == 1 and env.stats["groups_dropped_wrong_size"] == 1


async def test_teacher_distillation_serve_checks_each_group_once(monkeypatch, tiny_tokenizer_dir):
    from tests.envs.test_teacher_distillation import make_env

    check = _CountingCheck(monkeypatch)
    env, teacher = make_env(tiny_tokenizer_dir, rollout_server_url="http://127.0.0.1:9")
    env.n = 0
    sent = await _serve_items(env, [await env.get_next_item() for _ in range(2)])
    assert len(sent) == 2 and all(g["distill_logprobs"] for g in sent)
    assert check.calls == 2  # not three times (run_item, the teacher's pre-check, BaseEnv)


async def test_groups_an_env_passes_itself_are_still_checked_once(monkeypatch, tiny_tokenizer_dir):
    from tests.envs.test_teacher_distillation import make_env, make_group

    check = _CountingCheck(monkeypatch)
    env, _ = make_env(tiny_tokenizer_dir)
    bad = make_group(env.tokenizer, texts=["a b", "c d", "e f"])  # 3 sequences, group_size 2
    out = await env.handle_send_to_api([make_group(env.tokenizer), bad], do_send_to_api=False)
    assert len(out) == 1 and out[0]["distill_logprobs"] and env.stats["groups_dropped_wrong_size"] == 1
    assert check.calls == 2


def test_one_name_inside_the_code_for_the_length_limit():
    """``max_seq_len`` inside; Atropos 0.4's spellings at the edges (config key, env attribute)."""
    from atroposlib.envs.single_turn import SingleTurnEnvConfig

    assert BaseEnvConfig(max_token_length=300).max_seq_len == 300
    assert SingleTurnEnvConfig().max_seq_len == SingleTurnEnvConfig().max_token_length == 1024
    env = _env(max_token_length=64)
    env.bind_run_state(RunState(max_seq_len=48))
    assert (env.config.max_seq_len, env.run_state.max_seq_len, env.max_token_len) == (64, 48, 48)
