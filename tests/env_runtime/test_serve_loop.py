"""ServeLoop in-process against a real run-api: eval/checkpoint triggers, timeouts, total_steps."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging

import httpx
import tenacity
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from atroposlib.api.client import AsyncAtroposClient
from atroposlib.api.models import RegisterEnv, Registration
from atroposlib.env_runtime.serve import ServeLoop
from atroposlib.envs.base import BaseEnvConfig
from atroposlib.testing.fake_server import FakeServer
from tests.fixtures.sample_envs import ChatLengthEnv


class CountingEnv(ChatLengthEnv):
    evals = 0
    saved: list[int] = []

    async def evaluate(self, *args, **kwargs):
        type(self).evals += 1
        return {"eval/n": float(type(self).evals)}

    def save_checkpoint(self, step, data=None):
        type(self).saved.append(step)
        super().save_checkpoint(step, {"count": self.count})


def _serving(run_api, tiny_tokenizer, server, env_cls=ChatLengthEnv, loop_kwargs=None, **config):
    """An env served against ``run_api`` by ``server`` (not started): ``(env, loop)``."""
    env = env_cls(BaseEnvConfig(use_wandb=False, rollout_server_url=run_api.url, **config), [server])
    env.tokenizer = tiny_tokenizer
    return env, ServeLoop(env, **{"status_interval": 0.2, **(loop_kwargs or {})})


async def _trainer(url: str, tmp_path, batch_size: int = 8, num_steps: int = 100) -> AsyncAtroposClient:
    client = AsyncAtroposClient(url)
    await client.register(Registration(
        wandb_group="g", wandb_project="p", batch_size=batch_size, max_token_len=512,
        checkpoint_dir=str(tmp_path), save_checkpoint_interval=2, starting_step=0, num_steps=num_steps,
    ))
    assert await client.get_batch() is None
    return client


async def test_serve_loop_runs_evals_checkpoints_and_stops_at_total_steps(run_api, tiny_tokenizer, tmp_path):
    CountingEnv.evals, CountingEnv.saved = 0, []
    config = BaseEnvConfig(group_size=4, use_wandb=False, rollout_server_url=run_api.url,
                           steps_per_eval=2, total_steps=4, max_batches_offpolicy=1)
    env = CountingEnv(config, [FakeServer()])
    env.tokenizer = tiny_tokenizer
    trainer = await _trainer(run_api.url, tmp_path)
    loop = ServeLoop(env, status_interval=0.2)
    serving = asyncio.create_task(loop.run())
    pulled = 0
    async with asyncio.timeout(60):
        while not serving.done():
            if await trainer.get_batch():
                pulled += 1
            await asyncio.sleep(0.05)
    await serving  # returned by itself: total_steps reached
    assert pulled >= 3
    assert CountingEnv.evals >= 1  # crossing steps 2 (and 4)
    assert 2 in CountingEnv.saved
    ckpt = tmp_path / "env_checkpoints" / "chat_length_0" / "step-2.json"
    assert ckpt.exists()
    assert env.stats["groups_sent"] >= 2 * pulled
    await trainer.aclose()


async def test_slow_rollouts_time_out_and_their_items_are_retried(run_api, tiny_tokenizer, tmp_path):
    slow_first = {"calls": 0}

    def script(request):
        return "short" if request.index % 2 else "a longer reply"

    class SlowOnce(FakeServer):
        async def _chat_completion_wrapper(self, **kwargs):
            slow_first["calls"] += 1
            if slow_first["calls"] == 1:
                await asyncio.sleep(30)  # far beyond worker_timeout
            return await super()._chat_completion_wrapper(**kwargs)

    config = BaseEnvConfig(group_size=2, use_wandb=False, rollout_server_url=run_api.url,
                           worker_timeout=1, max_num_workers=1, total_steps=1000)
    env = ChatLengthEnv(config, [SlowOnce(script)])
    env.tokenizer = tiny_tokenizer
    trainer = await _trainer(run_api.url, tmp_path, batch_size=2)
    loop = ServeLoop(env, status_interval=0.2)
    serving = asyncio.create_task(loop.run())
    items = []
    async with asyncio.timeout(30):
        while len(items) < 2:
            batch = await trainer.get_batch()
            if batch:
                items.append(batch[0]["messages"][0][0]["content"])
            await asyncio.sleep(0.05)
    loop.stop_event.set()
    await serving
    assert env.stats["rollouts_timed_out"] == 1
    assert items[0] == "Question number 1?"  # the timed-out item was re-queued, not dropped
    await trainer.aclose()


async def test_spawning_pauses_at_the_offpolicy_limit_without_cancelling(run_api, tiny_tokenizer, tmp_path):
    """With nobody pulling batches, the env stops at max_batches_offpolicy batches queued."""
    server = FakeServer(latency=0.05)
    env, loop = _serving(run_api, tiny_tokenizer, server, group_size=4, max_batches_offpolicy=2,
                         max_num_workers=2)
    trainer = await _trainer(run_api.url, tmp_path, batch_size=8)
    serving = asyncio.create_task(loop.run())
    async with asyncio.timeout(30):
        while (await trainer.status())["queue_size"] < 4:
            await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)  # several status polls later ...
    requests = len(server.requests)
    await asyncio.sleep(1.0)
    assert len(server.requests) == requests  # ... nothing new was spawned
    # 2 batches x 8 sequences / group_size 4 = 4 groups (+ at most the 2 in flight then)
    assert 4 <= (await trainer.status())["queue_size"] <= 6
    assert env.stats["rollouts_timed_out"] == 0 and not loop.workers
    await trainer.get_batch()  # the trainer consumes a batch: the env resumes
    async with asyncio.timeout(30):
        while len(server.requests) == requests:
            await asyncio.sleep(0.1)
    loop.stop_event.set()
    await serving
    await trainer.aclose()


class MostlySameScoresEnv(ChatLengthEnv):
    """Three items in four give a group whose scores are all equal (dropped before sending)."""

    async def collect_trajectories(self, item):
        group, backlog = await super().collect_trajectories(item)
        if int(item.split()[-1].rstrip("?")) % 4:
            group["scores"] = [0.0] * len(group["scores"])
        return group, backlog


async def test_dropped_groups_do_not_hold_places_in_the_offpolicy_window(run_api, tiny_tokenizer, tmp_path):
    """With 3 in 4 groups dropped, more rollouts run at once than the window has groups."""
    env, loop = _serving(run_api, tiny_tokenizer, FakeServer(latency=0.3), MostlySameScoresEnv,
                         {"status_interval": 0.1}, group_size=4, max_batches_offpolicy=1,
                         max_num_workers=8)
    trainer = await _trainer(run_api.url, tmp_path, batch_size=8)  # window: 8 / 4 = 2 groups
    serving = asyncio.create_task(loop.run())
    most = 0
    async with asyncio.timeout(60):
        while env.stats["groups_dropped_same_scores"] < 12 or most <= 2:
            most = max(most, len(loop.workers))
            if (await trainer.status())["queue_size"] >= 2:
                await trainer.get_batch()  # keep room in the window, as a trainer would
            await asyncio.sleep(0.02)
    assert most > 2  # counted as whole groups, at most 2 would run at once
    loop.stop_event.set()
    await serving
    await trainer.aclose()


async def test_shutdown_with_the_api_down_is_bounded_and_counts_unsent(tiny_tokenizer, tmp_path):
    from tests.fixtures.api_server import start_run_api

    api = start_run_api()
    try:
        config = BaseEnvConfig(group_size=4, use_wandb=False, rollout_server_url=api.url,
                               max_batches_offpolicy=-1, max_num_workers=1)
        env = ChatLengthEnv(config, [FakeServer(latency=0.05)])
        env.tokenizer = tiny_tokenizer
        trainer = await _trainer(api.url, tmp_path)
        loop = ServeLoop(env, status_interval=0.2, flush_timeout=1.0)
        serving = asyncio.create_task(loop.run())
        async with asyncio.timeout(30):
            while env.stats["groups_sent"] < 2:
                await asyncio.sleep(0.05)
        api.stop()  # the API disappears; finished groups pile up in the outbox
        async with asyncio.timeout(30):
            while loop.outbox.queue.qsize() + (loop.outbox.sending is not None) < 2:
                await asyncio.sleep(0.05)
        loop.stop_event.set()
        start = asyncio.get_running_loop().time()
        await serving
        assert asyncio.get_running_loop().time() - start < 15
        assert env.stats["groups_sent"] >= 2 and env.stats.get("groups_unsendable", 0) == 0
        assert env.stats["groups_unsent_at_shutdown"] >= 2  # reported, not silently lost
        await trainer.aclose()
    finally:
        api.stop()


async def test_reregisters_against_an_upstream_api_that_answers_500_for_a_forgotten_env(tiny_tokenizer):
    """Atropos 0.4's API answers 500 (not 404) for unknown env ids; the env registers again."""

    app = FastAPI()
    registered: list[int] = []
    received: list[int] = []

    @app.post("/register-env")
    async def register_env() -> dict:
        registered.append(len(registered))
        return {"status": "success", "env_id": registered[-1], "wandb_name": f"x_{registered[-1]}",
                "checkpoint_dir": "", "starting_step": 0, "checkpoint_interval": -1, "num_steps": 10}

    @app.get("/info")
    async def info() -> dict:
        return {"batch_size": 8, "max_token_len": 512}

    @app.get("/status-env")
    async def status_env(request: Request) -> JSONResponse:
        env_id = json.loads(await request.body())["env_id"]  # Atropos 0.4 reads the GET's body
        if env_id == 0:  # "forgotten" after a restart
            return JSONResponse({"detail": "Internal Server Error"}, status_code=500)
        return JSONResponse({"current_step": 0, "queue_size": 0, "unallocated_fraction": 1.0,
                             "self_queue_size": 0, "max_group_size": 4, "env_weight": 1.0})

    @app.post("/scored_data")
    async def scored_data(request: Request) -> dict:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        received.append(json.loads(body)["env_id"])
        return {"status": "received"}

    @app.post("/disconnect-env")
    async def disconnect() -> dict:
        return {"status": "success"}

    config = BaseEnvConfig(group_size=4, use_wandb=False, rollout_server_url="http://upstream")
    env = ChatLengthEnv(config, [FakeServer()])
    env.tokenizer = tiny_tokenizer
    loop = ServeLoop(env, status_interval=0.05)
    await loop.client.aclose()
    loop.client._http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                          base_url="http://upstream")
    loop.client._stop = tenacity.stop_after_attempt(1)  # no client-side retries
    serving = asyncio.create_task(loop.run())
    async with asyncio.timeout(30):
        while 1 not in received:
            await asyncio.sleep(0.05)
    loop.stop_event.set()
    await serving
    assert registered == [0, 1] and env.env_id == 1


async def test_groups_carry_the_policy_version_their_rollout_started_with(tiny_tokenizer):
    """A rollout started at step 7 is sent as policy_version 7 even if the step moved meanwhile;
    run-api --max-staleness then drops it at batch time while a fresh group is served."""
    from atroposlib.api.factory import build_app
    from atroposlib.api.settings import ApiSettings

    app = build_app(ApiSettings(max_staleness=1, allowed_hosts=["api"]))
    config = BaseEnvConfig(group_size=4, use_wandb=False, rollout_server_url="http://api")
    env = ChatLengthEnv(config, [FakeServer(latency=0.2)])
    env.tokenizer = tiny_tokenizer
    loop = ServeLoop(env)
    await loop.client.aclose()
    loop.client._http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")
    await env.setup()

    loop.state.curr_step = 7
    slow = asyncio.create_task(loop._worker(await env.get_next_item()))
    await asyncio.sleep(0.05)  # the rollout is under way with the step-7 weights
    loop.state.curr_step = 9
    await slow
    await loop._worker(await env.get_next_item())
    stale, fresh = loop.outbox.queue.get_nowait(), loop.outbox.queue.get_nowait()
    assert (stale["policy_version"], fresh["policy_version"]) == (7, 9)

    trainer = loop.client
    await trainer.register(Registration(
        wandb_group="g", wandb_project="p", batch_size=4, max_token_len=512, checkpoint_dir="",
        save_checkpoint_interval=-1, starting_step=9, num_steps=100))
    assert await trainer.get_batch() is None
    loop.state.env_id = (await trainer.register_env(RegisterEnv(
        max_token_length=512, desired_name="e", weight=1.0, group_size=4)))["env_id"]
    assert await loop.outbox.send_group(stale) and await loop.outbox.send_group(fresh)
    batch = await trainer.get_batch()
    assert batch is not None and [g["scores"] for g in batch] == [fresh["scores"]]
    assert (await trainer.status())["stale_groups_dropped"] == {str(env.env_id): 1}
    await trainer.aclose()



def _paced(run_api, tiny_tokenizer, reply) -> tuple[ChatLengthEnv, ServeLoop]:
    """A two-worker env whose fake inference answers ``reply``, in a loop that backs off after 10."""
    return _serving(run_api, tiny_tokenizer, FakeServer(reply), loop_kwargs={"reject_streak": 10},
                    group_size=2, max_num_workers=2, total_steps=1000)


async def test_rollouts_whose_groups_are_all_too_long_back_off_with_one_warning(
        run_api, tiny_tokenizer, tmp_path, caplog):
    """A trainer max_token_len below every sequence: spawning backs off instead of spinning."""
    client = AsyncAtroposClient(run_api.url)
    await client.register(Registration(
        wandb_group="g", wandb_project="p", batch_size=8, max_token_len=4,  # every group too long
        checkpoint_dir=str(tmp_path), save_checkpoint_interval=0, starting_step=0, num_steps=100,
    ))
    assert await client.get_batch() is None  # the trainer has started: envs may register
    env, loop = _paced(run_api, tiny_tokenizer, lambda r: "short" if r.index % 2 else "a longer reply")
    serving = asyncio.create_task(loop.run())
    async with asyncio.timeout(30):
        while env.stats["groups_dropped_too_long"] < 10:
            await asyncio.sleep(0.05)
    await asyncio.sleep(2.0)
    loop.stop_event.set()
    await serving
    dropped = env.stats["groups_dropped_too_long"]
    # 10 before the streak counts, then pauses of 0.1, 0.2, 0.4, 0.8, 1.6 s: a few more in 2 s,
    # not hundreds (the unpaced loop dropped thousands per minute)
    assert dropped < 30, dropped
    assert env.stats["reject_backoffs"] >= 1
    warnings = [r.getMessage() for r in caplog.records if "pausing new rollouts" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "max_token_len (4)" in warnings[0] and "max_token_length" in warnings[0]
    assert env.stats["groups_sent"] == 0
    await client.aclose()


async def test_equal_score_drops_do_not_slow_spawning(run_api, tiny_tokenizer, tmp_path):
    """Groups dropped for identical scores are normal: no backoff however many in a row."""
    trainer = await _trainer(run_api.url, tmp_path)
    env, loop = _paced(run_api, tiny_tokenizer, lambda request: "same")  # every group scores the same
    serving = asyncio.create_task(loop.run())
    async with asyncio.timeout(30):
        while env.stats["groups_dropped_same_scores"] < 60:
            await asyncio.sleep(0.05)
    loop.stop_event.set()
    await serving
    assert env.stats["reject_backoffs"] == 0
    assert loop.pacer.inference_pause_until == 0.0
    await trainer.aclose()


def test_the_progress_line_counts_unsent_groups(caplog):
    """Logged every minute while serving; it read a queue method the outbox does not have."""
    caplog.set_level(logging.INFO, logger="atroposlib.env_runtime.serve")
    loop = ServeLoop(ChatLengthEnv(BaseEnvConfig(group_size=2, use_wandb=False), [FakeServer()]))
    loop.outbox.queue.put_nowait({"scores": [1.0, 0.0]})
    loop.log_progress(every=0.0)
    assert "0 rollout group(s) in flight, 1 unsent" in caplog.text
