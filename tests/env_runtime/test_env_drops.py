"""Groups an env drops after sampling reach run-api's ledger, once, with the env's next group."""

from __future__ import annotations

import os
import signal
from collections import Counter

import httpx

from atroposlib.api.client import AsyncAtroposClient, AtroposClient
from atroposlib.api.factory import build_app
from atroposlib.api.models import Registration
from atroposlib.api.settings import ApiSettings
from atroposlib.env_runtime.serve import ServeLoop
from atroposlib.envs.base import BaseEnvConfig
from atroposlib.envs.drops import DropTally
from atroposlib.envs.groups import check_groups
from atroposlib.envs.outcomes import Member
from atroposlib.testing.fake_server import FakeOpenAIServer, FakeServer
from tests.env_runtime.test_serve import _register_trainer, _start_env, _stop
from tests.fixtures.api_server import pull_batches, start_run_api
from tests.fixtures.lossy import LoseReplies, first_n
from tests.fixtures.sample_envs import ChatLengthEnv

REGISTRATION = {"wandb_group": "g", "wandb_project": "p", "batch_size": 4, "max_token_len": 64,
                "checkpoint_dir": "c", "save_checkpoint_interval": 10, "starting_step": 0,
                "num_steps": 10}


def group(seed: int, scores: tuple[float, float] = (1.0, 0.0)) -> dict:
    return {"tokens": [[seed, 2, 3], [seed, 2, 4]], "masks": [[-100, 2, 3], [-100, 2, 4]],
            "scores": list(scores)}


def test_check_groups_tallies_what_it_drops_and_take_starts_again() -> None:
    tally = DropTally()
    same = group(1, (1.0, 1.0)) | {"attempts": [1, 0], "rollout_ids": ["a/0", "a/1"]}
    checked = check_groups([group(2), same, group(3) | {"tokens": [[1]]}], 2, True, -1,
                           Counter(), tally)
    assert len(checked) == 1
    tally.add_members([Member("b/0", attempt=2, error=TimeoutError()), Member("b/1", value=1)],
                      "failed_members")
    assert tally.take() == {
        "groups": 3, "completed": 2 + 1, "masked": 0, "failed": 1 + 3, "tokens": 4,
        "masked_tokens": 0, "groups_by_reason": {"same_scores": 1, "invalid": 1, "failed_members": 1},
        "tokens_by_reason": {"same_scores": 4}}
    assert tally.take() is None


async def test_the_next_group_carries_the_drops_once_even_when_its_reply_is_lost(tiny_tokenizer) -> None:
    app = build_app(ApiSettings(allowed_hosts=["api"]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await c.post("/register", json=REGISTRATION)
        await c.get("/batch")
        env_id = (await c.post("/register-env", json={
            "max_token_length": 64, "desired_name": "e", "weight": 1, "group_size": 2})).json()["env_id"]
        env = ChatLengthEnv(BaseEnvConfig(group_size=2, use_wandb=False, ensure_scores_are_not_same=True,
                                          rollout_server_url="http://api"), [FakeServer()])
        env.tokenizer = tiny_tokenizer
        loop = ServeLoop(env)
        loop.state.env_id = env_id
        # the env's own check drops an all-same group; the next (good) group is queued to send
        env._check_groups([group(1, (0.5, 0.5))])
        assert env.stats["groups_dropped_same_scores"] == 1
        lossy = LoseReplies(httpx.ASGITransport(app=app), first_n("/scored_data", 1))
        loop.client = AsyncAtroposClient("http://api", transport=lossy, max_attempts=1)
        await loop.outbox.queue.put(group(2))
        assert await loop.outbox.flush() == 0
        assert len(lossy.lost) == 1  # posted twice with one key: stored (and counted) once
        ledger = (await c.get("/ledger")).json()
        await loop.client.aclose()
    assert ledger["tokens"] == {"sampled": 8, "served": 0, "dropped_stale": 0, "dropped_filter": 4,
                                "dropped_masked": 0, "queued": 4}
    assert ledger["rollouts"]["completed"] == 4 and ledger["closes"]
    assert ledger["dropped_filter_by_reason"] == {"same_scores": {"groups": 1, "tokens": 4}}
    assert env.run_state.drops.take() is None  # reported: nothing left to carry


def test_the_identity_closes_after_kill_9_of_the_env_and_of_run_api(tiny_tokenizer_dir, tmp_path) -> None:
    db, log = tmp_path / "q.db", tmp_path / "env.log"
    api = start_run_api(db=db)
    proc = None
    try:
        with FakeOpenAIServer() as inference:
            trainer = _register_trainer(api.url, tmp_path)
            proc = _start_env(api.url, inference.base_url, tiny_tokenizer_dir, log)
            assert len(pull_batches(trainer, 1, timeout=240)) == 1, log.read_text()[-3000:]
            os.killpg(proc.pid, signal.SIGKILL)  # the env dies with groups in flight
            proc.wait(15)
            mid = httpx.get(api.url + "/ledger").json()
            api.kill()
            api = start_run_api(db=db, port=api.port)
            after = httpx.get(api.url + "/ledger").json()
            # a new env process feeds the restarted server; the counts go on from the journal
            trainer = AtroposClient(api.url)  # the trainer resumes after the step it trained
            trainer.register(Registration(
                wandb_group="g", wandb_project="p", batch_size=8, max_token_len=512,
                checkpoint_dir=str(tmp_path / "ckpt"), save_checkpoint_interval=-1,
                starting_step=1, num_steps=1000))
            proc = _start_env(api.url, inference.base_url, tiny_tokenizer_dir, log)
            assert len(pull_batches(trainer, 1, timeout=240)) == 1, log.read_text()[-3000:]
            _stop(proc, log)
            end = httpx.get(api.url + "/ledger").json()
    finally:
        if proc is not None and proc.poll() is None:
            _stop(proc, log)
        api.stop()
    assert mid["closes"] and after == mid and end["closes"]
    assert mid["tokens"]["served"] > 0 and end["tokens"]["served"] > mid["tokens"]["served"]
    for ledger in (mid, end):
        t, r = ledger["tokens"], ledger["rollouts"]
        assert t["sampled"] == t["served"] + t["dropped_stale"] + t["dropped_filter"] + \
            t["dropped_masked"] + t["queued"]
        assert r["sampled"] == r["completed"] + r["masked"] + r["failed"]
