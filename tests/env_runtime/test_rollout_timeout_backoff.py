"""A group past ``rollout_timeout`` is a slow rollout, not an inference outage.

Against a real OpenAI-compatible server on 127.0.0.1: a slow one makes a ``SingleTurnEnv``
group fail as ``timeout`` and serve's pacer does not pause; a down one (connection refused) is
an inference outage and the pacer backs off as before; the client's own request timeout is an
outage too (the two timeouts are told apart by the exception's type).
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from tenacity import wait_none

from atroposlib.env_runtime.scheduling import RolloutPacer
from atroposlib.env_runtime.step import Skip, run_item
from atroposlib.envs import SingleTurnEnv
from atroposlib.envs.base import APIServerConfig
from atroposlib.envs.outcomes import failure_kind, run_members
from atroposlib.errors import RolloutTimeoutError
from atroposlib.testing.fake_server import FakeOpenAIServer, FakeServer

ITEM = (2, 3)


class SumEnv(SingleTurnEnv):
    """What is a + b? (the smallest SingleTurnEnv: one prompt, a length-parity score)."""

    name = "sum"

    async def setup(self):
        self.train_items, self.eval_items = [ITEM], []

    def prompt(self, item):
        return [{"role": "user", "content": f"What is {item[0]} + {item[1]}?"}]

    def score(self, item, completion):
        return float(len(completion) % 2)


def _env(base_url: str, tiny_tokenizer, *, rollout_timeout: float, client_timeout: int = 30) -> SumEnv:
    config = SumEnv.env_config_cls(group_size=2, use_wandb=False, rollout_timeout=rollout_timeout,
                                   ensure_scores_are_not_same=False)
    server = APIServerConfig(model_name="fake", base_url=base_url, api_key="x", server_type="vllm",
                             health_check=False, timeout=client_timeout)
    env = SumEnv(config, [server])
    env.tokenizer = tiny_tokenizer
    for client in env.server.servers:
        client.retry_wait = wait_none()  # retries at once: the test times the outage, not the waits
    return env


def _pacer(env: SumEnv) -> RolloutPacer:
    return RolloutPacer(env, env.run_state, inference_backoff_max=30, reject_streak=5)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_a_slow_server_fails_the_group_as_timeout_without_pausing_rollouts(tiny_tokenizer):
    with FakeOpenAIServer(FakeServer(tokenizer=tiny_tokenizer, latency=3.0)) as slow:
        env = _env(slow.base_url, tiny_tokenizer, rollout_timeout=0.3)
        outcome = await run_item(env, ITEM)
    assert outcome.reason is Skip.TIMEOUT and not outcome.groups
    assert isinstance(outcome.error, RolloutTimeoutError)
    assert "rollout_timeout=0.3 s" in str(outcome.error)
    assert failure_kind(outcome.error) == "timeout"
    assert env.stats["groups_dropped_timeout"] == 1 and env.stats["rollouts_failed_inference"] == 0
    pacer = _pacer(env)
    pacer.note(outcome)
    assert not pacer.paused() and pacer.inference_backoff == 1.0


async def test_a_down_server_is_an_outage_and_pauses_rollouts():
    env = _env(f"http://127.0.0.1:{_free_port()}/v1", None, rollout_timeout=30)
    outcome = await run_item(env, ITEM)
    assert outcome.reason is Skip.INFERENCE
    assert env.stats["rollouts_failed_inference"] == 1 and env.stats["groups_dropped_timeout"] == 0
    pacer = _pacer(env)
    pacer.note(outcome)
    assert pacer.paused() and pacer.inference_backoff == 2.0  # paused 1 s, next time 2 s


async def test_the_clients_own_request_timeout_is_still_an_outage(tiny_tokenizer):
    with FakeOpenAIServer(FakeServer(tokenizer=tiny_tokenizer, latency=3.0)) as slow:
        env = _env(slow.base_url, tiny_tokenizer, rollout_timeout=60, client_timeout=1)
        outcome = await run_item(env, ITEM)
    assert outcome.reason is Skip.INFERENCE
    assert not isinstance(outcome.error, RolloutTimeoutError)
    pacer = _pacer(env)
    pacer.note(outcome)
    assert pacer.paused()


async def test_run_members_marks_only_its_own_limit_as_a_rollout_timeout():
    async def roll(i: int) -> int:
        if i == 0:
            await asyncio.sleep(5)
        if i == 1:
            raise TimeoutError("the transport timed out")  # raised inside the rollout
        return i

    slow, own, done = await run_members(roll, 3, timeout=0.2)
    assert isinstance(slow.error, RolloutTimeoutError) and "rollout_timeout=0.2 s" in str(slow.error)
    assert type(own.error) is TimeoutError and failure_kind(own.error) == "timeout"
    assert done.completed and done.value == 2


@pytest.mark.parametrize("policy", ["retry", "drop"])
async def test_a_member_past_rollout_timeout_drops_its_group_as_timeout(tiny_tokenizer, policy):
    class SlowScore(SumEnv):
        async def score(self, item, completion):  # the scorer hangs past rollout_timeout
            await asyncio.sleep(5)

    config = SlowScore.env_config_cls(group_size=2, use_wandb=False, rollout_timeout=0.2,
                                      failed_rollout_policy=policy, max_rollout_retries=1)
    env = SlowScore(config, [FakeServer(tokenizer=tiny_tokenizer)])
    env.tokenizer = tiny_tokenizer
    outcome = await run_item(env, ITEM)
    assert outcome.reason is Skip.TIMEOUT and isinstance(outcome.error, RolloutTimeoutError)
    pacer = _pacer(env)
    pacer.note(outcome)
    assert not pacer.paused()
