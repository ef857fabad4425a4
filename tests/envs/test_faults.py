"""Fault injection: a seeded fraction of an env's rollouts is killed, timed out or corrupted.

Real envs (``collect_trajectory``, ``SingleTurnEnv``, ``MultiTurnEnv``) against the in-process
``FakeServer``, driven by the runners' own step (:func:`run_item`).
"""

from __future__ import annotations

import json

import pytest

from atroposlib.api.models import ScoredData
from atroposlib.env_runtime.command_line import build_env, run_cli
from atroposlib.env_runtime.step import Skip, run_item
from atroposlib.envs.base import BaseEnvConfig
from atroposlib.envs.faults import (
    OUTCOME_KIND,
    FaultSpec,
    InjectedFault,
    InjectedInferenceError,
    inject_faults,
)
from atroposlib.envs.run_state import RunState
from atroposlib.errors import ConfigError
from atroposlib.testing.fake_server import FakeServer
from tests.fixtures.sample_envs import SingleRolloutEnv


def _env(tokenizer, spec: FaultSpec, **overrides):
    config = BaseEnvConfig(**{"group_size": 4, "use_wandb": False, "rollout_timeout": 0.2,
                              "ensure_scores_are_not_same": False, **overrides})
    env = inject_faults(SingleRolloutEnv(config, [FakeServer()]), spec)
    env.tokenizer = tokenizer
    env.bind_run_state(RunState.for_config(config))
    return env


async def _groups(env, n: int) -> list:
    await env.setup()
    return [await run_item(env, await env.get_next_item()) for _ in range(n)]


def test_draws_are_seeded_and_hit_the_rate():
    spec = FaultSpec(rate=0.3, seed=1)
    draws = [spec.draw(g, i, 0) for g in range(1000) for i in range(4)]
    assert draws == [FaultSpec(rate=0.3, seed=1).draw(g, i, 0) for g in range(1000) for i in range(4)]
    assert draws != [FaultSpec(rate=0.3, seed=2).draw(g, i, 0) for g in range(1000) for i in range(4)]
    faults = [d for d in draws if d is not None]
    assert 0.27 < len(faults) / len(draws) < 0.33
    assert {k: faults.count(k) > 300 for k in ("kill", "timeout", "corrupt")} == dict.fromkeys(
        ("kill", "timeout", "corrupt"), True)
    assert all(FaultSpec(rate=1.0, kinds=("kill",)).draw(g, 0, 0) == "kill" for g in range(50))
    assert not any(FaultSpec(rate=0.0).draw(g, 0, 0) for g in range(50))


def test_the_spec_parses_and_names_what_is_wrong():
    assert FaultSpec.parse(" rate=0.5, kinds=kill+timeout ,seed=3,log=f.jsonl") == FaultSpec(
        rate=0.5, kinds=("kill", "timeout"), seed=3, log="f.jsonl")
    assert FaultSpec.parse("rate=0.1") == FaultSpec(0.1, ("kill", "timeout", "corrupt"), 0, None)
    for text, message in (("rate=1.5", "in [0, 1]"), ("rate=0.1,kinds=kill+boom", "some of kill"),
                          ("seed=3", "has no rate"), ("rate=x", "bad fault spec part 'rate=x'"),
                          ("rate=0.1,speed=2", "'speed=2'")):
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            FaultSpec.parse(text)


async def test_injected_faults_fail_their_members_with_their_kinds(tiny_tokenizer, tmp_path):
    log = tmp_path / "faults.jsonl"
    env = _env(tiny_tokenizer, FaultSpec(rate=0.4, seed=5, log=str(log)),
               failed_rollout_policy="shrink", min_completed_rollouts=1)
    outcomes = await _groups(env, 8)
    injector = env.fault_injector
    injected = {(f.rollout_id, f.attempt): f.kind for f in injector.injected}
    assert injector.groups == 8 and set(injector.counts) == {"kill", "timeout", "corrupt"}
    assert [json.loads(line) for line in log.read_text().splitlines()] == [
        {"rollout_id": f.rollout_id, "attempt": f.attempt, "kind": f.kind, "group": f.group}
        for f in injector.injected]
    sent = [o.group for o in outcomes if o.group is not None]
    assert sent, [o.reason for o in outcomes]
    for group in sent:
        # every failed member is an injected fault, failed with that fault's kind, without a score
        failed = {(m["rollout_id"], m["attempt"]): m["kind"] for m in group.get("excluded", [])}
        assert failed == {k: OUTCOME_KIND[v] for k, v in injected.items()
                          if k[0].split("/")[0] == group["rollout_ids"][0].split("/")[0]}
        assert all("score" not in m for m in group.get("excluded", []))
        # and no kept member is one
        assert not {(r, a) for r, a in zip(group["rollout_ids"], group["attempts"], strict=True)
                    } & set(injected)
        ScoredData(**group)
    # groups whose every member failed are raised again, as before (the runner counts them)
    for outcome in outcomes:
        if outcome.group is None:
            assert isinstance(outcome.error, (InjectedFault, InjectedInferenceError, TimeoutError))
    assert env.stats["faults_injected_kill"] == injector.counts["kill"]


async def test_retry_rolls_a_faulted_member_out_again(tiny_tokenizer):
    env = _env(tiny_tokenizer, FaultSpec(rate=0.3, seed=2, kinds=("kill", "corrupt")))
    outcomes = await _groups(env, 6)
    injected = {(f.rollout_id, f.attempt) for f in env.fault_injector.injected}
    retried = 0
    for group in (o.group for o in outcomes if o.group is not None):
        assert len(group["tokens"]) == 4 and "excluded" not in group  # whole groups only
        for rid, attempt in zip(group["rollout_ids"], group["attempts"], strict=True):
            # attempts before the kept one were all injected faults; the kept one was not
            assert {(rid, a) for a in range(attempt)} <= injected and (rid, attempt) not in injected
            retried += attempt > 0
    assert retried > 0


async def test_the_same_seed_injects_the_same_faults(tiny_tokenizer):
    def pattern(env):
        return [(f.group, f.rollout_id.split("/")[1], f.attempt, f.kind)
                for f in env.fault_injector.injected]

    spec = FaultSpec(rate=0.5, seed=9, kinds=("kill", "corrupt"))
    first, second = _env(tiny_tokenizer, spec), _env(tiny_tokenizer, spec)
    await _groups(first, 5)
    await _groups(second, 5)
    assert pattern(first) == pattern(second) and pattern(first)


async def test_a_wrapped_class_gives_each_instance_its_own_injector(tiny_tokenizer):
    faulty = inject_faults(SingleRolloutEnv, FaultSpec(rate=1.0, kinds=("corrupt",)))
    assert issubclass(faulty, SingleRolloutEnv) and faulty.name == SingleRolloutEnv.name
    assert faulty.__name__ == "FaultySingleRolloutEnv"
    config = BaseEnvConfig(group_size=2, use_wandb=False)
    envs = [faulty(config, [FakeServer()]) for _ in range(2)]
    assert envs[0].fault_injector is not envs[1].fault_injector
    env = envs[0]
    env.tokenizer = tiny_tokenizer
    env.bind_run_state(RunState.for_config(config))
    [outcome] = await _groups(env, 1)
    # every member corrupted, on every try: the group is dropped as an inference failure
    assert outcome.reason is Skip.INFERENCE and isinstance(outcome.error, InjectedInferenceError)
    assert env.fault_injector.counts["corrupt"] == 2 * (1 + config.max_rollout_retries)
    with pytest.raises(TypeError, match="BaseEnv class or instance"):
        inject_faults(object(), FaultSpec(rate=0.1))


async def test_single_turn_and_multi_turn_envs_are_hooked(tiny_tokenizer_dir):
    from atroposlib.envs.episodes import run_episode
    from atroposlib.envs.multi_turn import MultiTurnEnv
    from atroposlib.envs.single_turn import SingleTurnEnv

    class Single(SingleTurnEnv):
        def prompt(self, item):
            return [{"role": "user", "content": f"item {item}"}]

        def score(self, item, completion):
            return float(len(completion))

    class Multi(MultiTurnEnv):
        async def play_episode(self, item, *, temperature, split):
            episode = await run_episode(self.server, self.tokenizer,
                                        [{"role": "user", "content": "hi"}], lambda t, k: None,
                                        max_turns=1, max_tokens=8)
            return episode, 1.0, {}

    for cls in (Single, Multi):
        config, _ = cls.config_init()
        config = cls.env_config_cls(**{**config.model_dump(), "tokenizer_name": str(tiny_tokenizer_dir),
                                       "group_size": 3, "use_wandb": False, "max_tokens": 8,
                                       "ensure_scores_are_not_same": False,
                                       "failed_rollout_policy": "shrink", "min_completed_rollouts": 1})
        env = inject_faults(cls(config, [FakeServer(lambda req: "a reply")]),
                            FaultSpec(rate=0.5, seed=4, kinds=("kill",)))
        env.bind_run_state(RunState.for_config(config))
        env.train_items = [1, 2, 3]
        groups = [(await run_item(env, i)).group for i in (1, 2, 3)]
        excluded = [m for g in groups if g for m in g.get("excluded", [])]
        assert env.fault_injector.groups == 3, cls
        assert len(excluded) == env.fault_injector.counts["kill"] > 0, cls
        assert {m["kind"] for m in excluded} == {"env_error"}
        assert all("injected fault" in m["message"] for m in excluded)


def test_the_command_line_injects_what_atropos_faults_asks(tiny_tokenizer_dir, monkeypatch, capsys):
    argv = ["process", "--testing", "--env.tokenizer_name", str(tiny_tokenizer_dir)]
    _, plain = build_env(SingleRolloutEnv, argv)
    assert not hasattr(plain, "fault_injector")
    monkeypatch.setenv("ATROPOS_FAULTS", "rate=0.25,kinds=timeout,seed=7")
    _, env = build_env(SingleRolloutEnv, argv)
    assert env.fault_injector.spec == FaultSpec(rate=0.25, kinds=("timeout",), seed=7)
    monkeypatch.setenv("ATROPOS_FAULTS", "rate=0.25,kinds=slow")
    with pytest.raises(SystemExit) as exit_info:
        run_cli(SingleRolloutEnv, argv)
    assert exit_info.value.code == 2
    assert "fault kinds must be some of kill, timeout, corrupt, got slow" in capsys.readouterr().err


async def test_wrapping_twice_keeps_one_wrapper_and_the_later_spec(tiny_tokenizer, caplog):
    env = _env(tiny_tokenizer, FaultSpec(rate=1.0, kinds=("kill",)))
    wrapper = env.run_rollouts
    with caplog.at_level("WARNING", logger="atroposlib.envs.faults"):
        assert inject_faults(env, FaultSpec(rate=0.0)) is env
    assert env.run_rollouts is wrapper  # the same wrapper, now with the second spec
    assert env.fault_injector.spec == FaultSpec(rate=0.0)
    [line] = [r.getMessage() for r in caplog.records]
    assert "the later spec wins: 0% of rollout attempts" in line and "replaces 100%" in line
    [outcome] = await _groups(env, 1)
    assert outcome.reason is None and not env.fault_injector.injected  # the kills are gone


async def test_atropos_faults_wins_over_a_class_wrapped_in_code_and_applies_once(
        tiny_tokenizer_dir, tiny_tokenizer, monkeypatch, caplog):
    faulty = inject_faults(SingleRolloutEnv, FaultSpec(rate=1.0, kinds=("kill",)))
    monkeypatch.setenv("ATROPOS_FAULTS", "rate=0.5,kinds=corrupt,seed=2")
    argv = ["process", "--testing", "--env.tokenizer_name", str(tiny_tokenizer_dir),
            "--env.group_size", "4", "--env.ensure_scores_are_not_same", "false"]
    with caplog.at_level("WARNING", logger="atroposlib.envs.faults"):
        _, env = build_env(faulty, argv)
    spec = FaultSpec(rate=0.5, kinds=("corrupt",), seed=2)
    assert env.fault_injector.spec == spec
    [line] = [r.getMessage() for r in caplog.records]
    assert "ATROPOS_FAULTS is set: injecting faults into 50% of rollout attempts (corrupt, seed 2)" in line
    assert "wins over the faults the code injects (100% of rollout attempts (kill, seed 0))" in line
    env.tokenizer = tiny_tokenizer
    env.bind_run_state(RunState.for_config(env.config))
    await _groups(env, 3)
    injector = env.fault_injector
    # one draw per attempt, from the variable's spec only: no kill, and exactly its draws
    assert set(injector.counts) == {"corrupt"}
    assert all(spec.draw(f.group, int(f.rollout_id.rsplit("/", 1)[1]), f.attempt) == "corrupt"
               for f in injector.injected)
    assert env.stats["faults_injected_kill"] == 0
    assert env.stats["faults_injected_corrupt"] == injector.counts["corrupt"] > 0
