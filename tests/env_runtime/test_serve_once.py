"""The env's sender posts each group with one Idempotency-Key, reused on every retry."""

from __future__ import annotations

import httpx

from atroposlib.api.client import AsyncAtroposClient
from atroposlib.api.factory import build_app
from atroposlib.api.settings import ApiSettings
from atroposlib.env_runtime.serve import ServeLoop
from atroposlib.envs.base import BaseEnvConfig
from atroposlib.testing.fake_server import FakeServer
from tests.fixtures.lossy import LoseReplies, first_n
from tests.fixtures.sample_envs import ChatLengthEnv

REGISTRATION = {"wandb_group": "g", "wandb_project": "p", "batch_size": 4, "max_token_len": 64,
                "checkpoint_dir": "c", "save_checkpoint_interval": 10, "starting_step": 0,
                "num_steps": 10}


def group(seed: int) -> dict:
    return {"tokens": [[seed, 2, 3], [seed, 2, 4]], "masks": [[-100, 2, 3], [-100, 2, 4]],
            "scores": [1.0, 0.0]}


async def test_lost_replies_and_a_flush_resend_store_each_group_once(tiny_tokenizer) -> None:
    app = build_app(ApiSettings(allowed_hosts=["api"]))  # the in-process client's base URL
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await c.post("/register", json=REGISTRATION)
        await c.get("/batch")
        env_id = (await c.post("/register-env", json={
            "max_token_length": 64, "desired_name": "e", "weight": 1, "group_size": 2})).json()["env_id"]
        env = ChatLengthEnv(BaseEnvConfig(group_size=2, use_wandb=False,
                                          rollout_server_url="http://api"), [FakeServer()])
        env.tokenizer = tiny_tokenizer
        loop = ServeLoop(env)
        loop.state.env_id = env_id
        lossy = LoseReplies(httpx.ASGITransport(app=app), first_n("/scored_data", 2))
        loop.client = AsyncAtroposClient("http://api", transport=lossy, max_attempts=1)
        assert await loop.outbox.send_group(group(1))  # two replies lost; the sender's retries resend
        assert len(lossy.lost) == 2 and env.stats["send_retries"] == 2
        assert (await c.get("/status")).json()["queue_size"] == 1
        # a group whose send was interrupted after the server stored it: flush resends it
        direct = AsyncAtroposClient("http://api", transport=httpx.ASGITransport(app=app))
        await direct.post_scored_data({**group(2), "env_id": env_id}, idempotency_key="interrupted")
        loop.outbox.sending, loop.outbox.sending_key = group(2), "interrupted"
        assert await loop.outbox.flush() == 0
        assert (await c.get("/status")).json()["queue_size"] == 2
        assert env.stats["groups_sent"] == 2 and not env.stats.get("groups_rejected_by_api")
        await loop.client.aclose()
