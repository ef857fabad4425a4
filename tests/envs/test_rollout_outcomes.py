"""Rollout outcomes on the env side: a failed member fails alone, and the policy decides its group.

Real envs against the in-process ``FakeServer``; the groups they make are checked by the same
checks the runners use and by the API's wire model.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from atroposlib.api.models import ScoredData
from atroposlib.env_runtime.checks import check_group
from atroposlib.env_runtime.step import Skip, run_item
from atroposlib.envs.base import BaseEnvConfig
from atroposlib.envs.groups import check_groups
from atroposlib.envs.outcomes import exclude_member, failure_kind
from atroposlib.envs.run_state import RunState
from atroposlib.errors import InferenceError
from atroposlib.testing.fake_server import FakeServer
from tests.fixtures.sample_envs import SingleRolloutEnv


class ScriptedEnv(SingleRolloutEnv):
    """collect_trajectory whose k-th call (0-based, per item) does what ``script[k]`` says."""

    script: dict[int, str] = {}

    async def setup(self) -> None:
        await super().setup()
        self.calls = 0

    async def collect_trajectory(self, item):
        k = self.calls
        self.calls += 1
        action = self.script.get(k)
        if action == "inference":
            raise InferenceError("the inference server returned 503")
        if action == "score":
            raise ZeroDivisionError("the scorer divided by zero")
        if action == "slow":
            await asyncio.sleep(30)
        scored, backlog = await super().collect_trajectory(item)
        scored["scores"] = float(k)
        return scored, backlog


def _env(tokenizer, script, **overrides) -> ScriptedEnv:
    cls = type("Env", (ScriptedEnv,), {"script": script})
    config = BaseEnvConfig(**{"group_size": 4, "use_wandb": False,
                              "ensure_scores_are_not_same": False, **overrides})
    env = cls(config, [FakeServer()])
    env.tokenizer = tokenizer
    env.bind_run_state(RunState.for_config(config))
    return env


def _kinds(group) -> list[str]:
    return [m.get("kind") or m.get("reason") for m in group.get("excluded") or []]


async def _group(env):
    await env.setup()
    return await run_item(env, await env.get_next_item())


async def test_clean_group_carries_ids_and_no_exclusions(tiny_tokenizer):
    outcome = await _group(_env(tiny_tokenizer, {}))
    group = outcome.group
    assert group["scores"] == [0.0, 1.0, 2.0, 3.0]
    assert group["attempts"] == [0, 0, 0, 0] and "excluded" not in group
    prefix = {rid.split("/")[0] for rid in group["rollout_ids"]}
    assert len(prefix) == 1 and [r.split("/")[1] for r in group["rollout_ids"]] == list("0123")
    ScoredData(**group)  # valid on the wire


async def test_failures_are_captured_per_member_and_the_group_shrinks(tiny_tokenizer):
    env = _env(tiny_tokenizer, {1: "inference", 2: "score"}, failed_rollout_policy="shrink")
    outcome = await _group(env)
    assert outcome.reason is None
    group = outcome.group
    # the completed members only, in order; the failed ones have no score at all
    assert group["scores"] == [0.0, 3.0] and len(group["tokens"]) == 2
    assert _kinds(group) == ["inference", "env_error"]
    assert all("score" not in m and m["outcome"] == "failed" for m in group["excluded"])
    assert "ZeroDivisionError: the scorer divided by zero" in group["excluded"][1]["message"]
    ids = group["rollout_ids"] + [m["rollout_id"] for m in group["excluded"]]
    assert sorted(r.split("/")[1] for r in ids) == list("0123")
    assert env.stats["members_failed_inference"] == 1
    assert env.stats["members_failed_env_error"] == 1
    check_group(group, 4)  # kept + excluded = group_size
    wire = ScoredData(**group)
    assert [m.kind for m in wire.excluded] == ["inference", "env_error"]


async def test_a_slow_member_times_out_alone(tiny_tokenizer):
    env = _env(tiny_tokenizer, {0: "slow"}, rollout_timeout=0.2, failed_rollout_policy="shrink")
    group = (await _group(env)).group
    assert group["scores"] == [1.0, 2.0, 3.0]
    assert _kinds(group) == ["timeout"]
    assert "rollout_timeout=0.2 s" in group["excluded"][0]["message"]


async def test_too_few_completed_drops_the_group(tiny_tokenizer):
    env = _env(tiny_tokenizer, {0: "score", 1: "score", 2: "inference"}, min_completed_rollouts=2,
               failed_rollout_policy="shrink")
    outcome = await _group(env)
    assert outcome.group is None and outcome.reason is Skip.RETURNED_NONE
    assert env.stats["groups_dropped_too_few_completed"] == 1


async def test_every_member_failing_is_classified_as_before(tiny_tokenizer):
    env = _env(tiny_tokenizer, dict.fromkeys(range(12), "inference"))  # 4 tries + 2 retries each
    outcome = await _group(env)
    assert env.calls == 12
    assert outcome.reason is Skip.INFERENCE  # the serve loop re-queues the item, as before
    assert isinstance(outcome.error, InferenceError)


async def test_drop_policy_drops_the_group_as_before(tiny_tokenizer):
    env = _env(tiny_tokenizer, {2: "score"}, failed_rollout_policy="drop")
    outcome = await _group(env)
    assert outcome.reason is Skip.ERROR and isinstance(outcome.error, ZeroDivisionError)


async def test_retry_policy_retries_failed_members_a_bounded_number_of_times(tiny_tokenizer):
    # call 4 is member 1's retry (it succeeds); member 2 fails on both tries (calls 2 and 5):
    # the group is still short after the retries, so it is dropped, with member 2's error
    env = _env(tiny_tokenizer, {1: "inference", 2: "score", 5: "score"},
               failed_rollout_policy="retry", max_rollout_retries=1)
    outcome = await _group(env)
    assert env.calls == 6  # 4 first tries + 2 retries, no more
    assert outcome.group is None
    assert outcome.reason is Skip.ERROR and isinstance(outcome.error, ZeroDivisionError)


async def test_retry_is_the_default_and_sends_whole_groups(tiny_tokenizer):
    # calls 1 and 2 fail; their retries (calls 4 and 5) succeed: a whole group, no exclusions
    env = _env(tiny_tokenizer, {1: "inference", 2: "score"})
    assert env.config.failed_rollout_policy == "retry"
    group = (await _group(env)).group
    assert env.calls == 6
    assert group["scores"] == [0.0, 4.0, 5.0, 3.0]
    assert group["attempts"] == [0, 1, 1, 0] and "excluded" not in group
    assert [r.split("/")[1] for r in group["rollout_ids"]] == list("0123")  # the same ids across tries


def test_env_side_size_check_counts_excluded_members():
    base = {"tokens": [[1, 2], [1, 3]], "masks": [[-100, 2], [-100, 3]], "scores": [1.0, 0.0]}
    failed = {"rollout_id": "g/2", "outcome": "failed", "kind": "timeout"}
    stats: dict = __import__("collections").Counter()
    kept = check_groups([{**base, "excluded": [failed]}], 3, False, -1, stats)
    assert len(kept) == 1
    dropped = check_groups([{**base, "excluded": [failed, failed]}], 3, False, -1, stats)
    assert not dropped and "2 excluded members" in dropped.dropped[0][1]


def test_exclude_member_masks_one_member_in_place():
    group = {"tokens": [[1, 2], [1, 3], [1, 4]], "masks": [[-100, 2], [-100, 3], [-100, 4]],
             "scores": [1.0, 0.5, 0.0], "messages": [["a"], ["b"], ["c"]],
             "rollout_ids": ["g/0", "g/1", "g/2"], "attempts": [0, 0, 0],
             "generation_params": {"temperature": 1.0}}
    entry = exclude_member(group, 1, "format", "no <answer> tag")
    assert entry == {"rollout_id": "g/1", "attempt": 0, "outcome": "masked", "reason": "format",
                     "message": "no <answer> tag", "score": 0.5, "tokens": [1, 3],
                     "masks": [-100, 3]}
    assert group["scores"] == [1.0, 0.0] and group["rollout_ids"] == ["g/0", "g/2"]
    assert group["messages"] == [["a"], ["c"]] and group["excluded"] == [entry]
    check_group({k: v for k, v in group.items() if k != "messages"}, 3)
    with pytest.raises(IndexError):
        exclude_member(group, 5, "env")


def test_failure_kinds():
    class SandboxDown(RuntimeError):
        rollout_failure_kind = "sandbox"

    assert failure_kind(TimeoutError()) == "timeout"
    assert failure_kind(InferenceError("x")) == "inference"
    assert failure_kind(KeyError("x")) == "env_error"
    assert failure_kind(SandboxDown()) == "sandbox"


# ---------------------------------------------------------------- SingleTurnEnv and MultiTurnEnv
def _reply(req):
    return ["right", "wrong", "a very long reply that goes on and on"][req.index % 3]


def _single_turn(tok_dir, score, mask_truncated=False, **overrides):
    from atroposlib.envs import SingleTurnEnv

    class Env(SingleTurnEnv):
        def prompt(self, item):
            return [{"role": "user", "content": f"item {item}"}]

        def score(self, item, completion):
            return score(completion)

    Env.mask_truncated = mask_truncated
    config, _ = Env.config_init()
    config = Env.env_config_cls(**{**config.model_dump(), "tokenizer_name": tok_dir,
                                   "group_size": 3, "use_wandb": False, "max_tokens": 8,
                                   "ensure_scores_are_not_same": False, **overrides})
    env = Env(config, [FakeServer(_reply)])
    env.bind_run_state(RunState.for_config(config))
    env.train_items = [1, 2, 3]
    return env


def _score(text):
    if text == "wrong":
        raise ValueError("could not parse the reply")
    return 1.0


async def test_single_turn_scorer_exception_drops_the_group_unless_it_may_shrink(tiny_tokenizer_dir):
    # the default (retry) sends whole groups only: a reply whose scoring fails drops its group
    outcome = await run_item(_single_turn(str(tiny_tokenizer_dir), _score), 1)
    assert outcome.group is None and isinstance(outcome.error, ValueError)
    env = _single_turn(str(tiny_tokenizer_dir), _score, failed_rollout_policy="shrink")
    outcome = await run_item(env, 1)
    group = outcome.group
    assert group["scores"] == [1.0, 1.0] and _kinds(group) == ["env_error"]
    assert group["excluded"][0]["rollout_id"].endswith("/1")
    check_group(group, 3)
    ScoredData(**group)


async def test_single_turn_masks_truncated_replies_only_when_opted_in(tiny_tokenizer_dir):
    plain = await run_item(_single_turn(str(tiny_tokenizer_dir), lambda t: 1.0), 1)
    assert len(plain.group["tokens"]) == 3 and "excluded" not in plain.group  # unchanged default
    env = _single_turn(str(tiny_tokenizer_dir), lambda t: 1.0, mask_truncated=True)
    group = (await run_item(env, 1)).group
    assert len(group["tokens"]) == 2 and _kinds(group) == ["truncated"]
    masked = group["excluded"][0]
    assert masked["outcome"] == "masked" and masked["tokens"] and "score" not in masked
    assert env.stats["members_masked_truncated"] == 1
    check_group(group, 3)
    ScoredData(**group)


async def test_multi_turn_episode_failure_fails_only_its_member(tiny_tokenizer_dir):
    from atroposlib.envs.multi_turn import MultiTurnEnv

    class Env(MultiTurnEnv):
        async def play_episode(self, item, *, temperature, split):
            from atroposlib.envs.episodes import run_episode

            self.episodes = number = getattr(self, "episodes", 0) + 1
            if number == 2:
                raise InferenceError("connection reset mid-episode")
            episode = await run_episode(self.server, self.tokenizer,
                                        [{"role": "user", "content": "hi"}], lambda t, k: None,
                                        max_turns=1, max_tokens=8)
            return episode, float(number), {}

    config, _ = Env.config_init()
    config = Env.env_config_cls(**{**config.model_dump(), "tokenizer_name": str(tiny_tokenizer_dir),
                                   "group_size": 3, "use_wandb": False,
                                   "ensure_scores_are_not_same": False,
                                   "failed_rollout_policy": "shrink"})
    env = Env(config, [FakeServer(_reply)])
    env.bind_run_state(RunState.for_config(config))
    env.train_items = [1]
    group = (await run_item(env, 1)).group
    assert group["scores"] == [1.0, 3.0] and _kinds(group) == ["inference"]
    assert re.fullmatch(r"[0-9a-f]{12}/1", group["excluded"][0]["rollout_id"])
    check_group(group, 3)


async def test_process_mode_writes_groups_with_outcomes(tiny_tokenizer, tmp_path):
    """process mode: groups with a failed member are written to JSONL and rendered to HTML."""
    import json

    path = tmp_path / "groups.jsonl"
    env = _env(tiny_tokenizer, {1: "score", 5: "inference"}, total_steps=2,
               data_path_to_save_groups=str(path), failed_rollout_policy="shrink")
    assert await env.process_manager(show_progress=False) == path
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 2
    assert [m["kind"] for row in rows for m in row.get("excluded") or []] == [
        "env_error", "inference"]
    assert all(len(row["tokens"]) == len(row["rollout_ids"]) == 3 for row in rows)
    assert path.with_suffix(".html").exists()


async def test_env_group_with_a_failed_member_through_a_real_run_api(tiny_tokenizer):
    """The env's group, as its sender posts it, through run-api (uvicorn on 127.0.0.1) to /batch."""
    import httpx

    from atroposlib.api.client import AsyncAtroposClient
    from tests.fixtures.api_server import start_run_api

    env = _env(tiny_tokenizer, {2: "slow"}, rollout_timeout=0.2, failed_rollout_policy="shrink")
    outcome = await _group(env)
    [group] = env._accept_groups(outcome.groups)  # normalised as the sender sends it
    api = start_run_api()
    try:
        client = AsyncAtroposClient(api.url)
        await client.request("POST", "/register", {
            "wandb_group": "g", "wandb_project": "p", "batch_size": 6, "max_token_len": 256,
            "checkpoint_dir": "c", "save_checkpoint_interval": 10, "starting_step": 0,
            "num_steps": 10})
        await client.request("GET", "/batch")
        env_id = (await client.request("POST", "/register-env", {
            "max_token_length": 256, "desired_name": "e", "weight": 1, "group_size": 4}))["env_id"]
        for _ in range(2):  # two shrunk groups of 3 fill the batch of 6
            answer = await client.post_scored_data({**group, "env_id": env_id})
            assert answer["status"] == "received"
        served = httpx.get(api.url + "/batch", headers=api.headers, timeout=10).json()["batch"]
        await client.aclose()
    finally:
        api.stop()
    got = served[0]
    assert len(served) == 2 and served[1] == got
    assert got["scores"] == [0.0, 1.0, 3.0] and got["rollout_ids"] == group["rollout_ids"]
    assert [(m["outcome"], m["kind"]) for m in got["excluded"]] == [("failed", "timeout")]
