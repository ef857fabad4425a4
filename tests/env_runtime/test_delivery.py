"""Delivery: the runners take checked groups straight to the sinks, without a U-turn through the env."""

from __future__ import annotations

import json

from atroposlib.envs import groups as groups_module
from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.testing.fake_server import FakeServer
from tests.fixtures.sample_envs import ChatLengthEnv


def _env(cls, tokenizer, path) -> BaseEnv:
    config = BaseEnvConfig(group_size=2, use_wandb=False, total_steps=3, ensure_scores_are_not_same=False,
                           data_path_to_save_groups=str(path))
    env = cls(config, [FakeServer()])
    env.tokenizer = tokenizer
    return env


async def test_process_checks_each_group_once_and_never_goes_back_through_the_env(
        tiny_tokenizer, tmp_path, monkeypatch):
    checks: list[int] = []
    real_check = groups_module.check_groups

    def counting_check(scored, *args, **kwargs):
        if not isinstance(scored, groups_module.CheckedGroups):  # a checked list passes as it is
            checks.append(len(scored) if isinstance(scored, list) else 1)
        return real_check(scored, *args, **kwargs)

    # run_item and BaseEnv (its GroupSendingMixin) both use this one check
    monkeypatch.setattr("atroposlib.env_runtime.step.check_groups", counting_check)
    monkeypatch.setattr("atroposlib.envs.sending.check_groups", counting_check)

    class NoUTurn(ChatLengthEnv):
        prepared = 0

        async def prepare_checked_groups(self, groups):
            type(self).prepared += len(groups)

    calls: list[str] = []
    original = BaseEnv.handle_send_to_api

    async def spy(self, *args, **kwargs):  # the same method, recorded when called
        calls.append("handle_send_to_api")
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(BaseEnv, "handle_send_to_api", spy)
    env = _env(NoUTurn, tiny_tokenizer, tmp_path / "groups.jsonl")
    assert await env.process_manager(show_progress=False) == tmp_path / "groups.jsonl"
    rows = [json.loads(x) for x in (tmp_path / "groups.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(len(r["tokens"]) == 2 for r in rows)
    assert calls == []  # no U-turn: the runner delivered the groups itself ...
    assert checks == [1, 1, 1]  # ... after checking each group once
    assert NoUTurn.prepared == 3  # and the env's hook still saw every group
    assert env.stats["groups_accepted"] == 3


async def test_an_env_that_overrides_handle_send_to_api_keeps_its_override(tiny_tokenizer, tmp_path):
    class Tagging(ChatLengthEnv):
        async def handle_send_to_api(self, scored_data, item=None, do_send_to_api=True,
                                     abort_on_any_max_length_exceeded=True):
            for group in scored_data:
                group["overrides"] = [{"tagged": True}] * len(group["tokens"])
            return await super().handle_send_to_api(scored_data, item, do_send_to_api,
                                                     abort_on_any_max_length_exceeded)

    path = tmp_path / "groups.jsonl"
    env = _env(Tagging, tiny_tokenizer, path)
    await env.process_manager(show_progress=False)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(rows) == 3 and all(r["overrides"] == [{"tagged": True}] * 2 for r in rows)
