"""Exactly once into the weights, server side: run-api keeps the last K served batches by step.

A trainer that restarts from the checkpoint of step C registers again with ``starting_step=C``;
run-api does not renumber, and ``GET /batch?step=N`` answers the batches of steps C+1.. that the
checkpoint does not hold (durable with ``--db``, across a kill -9), then serves new ones. Atropos
0.4 trainers that register once with step 0 see no difference.
"""

from __future__ import annotations

import logging
from collections import Counter

import httpx
import pytest

from atroposlib.api.client import AsyncAtroposClient, AtroposClient
from atroposlib.api.errors import StepConflictError
from atroposlib.api.models import Registration, ScoredData
from atroposlib.api.settings import REPLAY_BATCHES_CAP, ApiSettings
from atroposlib.api.state import ApiState
from atroposlib.api.store import SqliteStore
from tests.fixtures.api_server import start_run_api

from .conftest import REGISTRATION, make_app, make_group, register, start_trainer
from .test_exactly_once import Server, fill


def tokens_of(batch: list[dict]) -> list:
    return [tuple(map(tuple, g["tokens"])) for g in batch]


async def check_kept(server: Server, served: dict[int, bytes]) -> None:
    async with server.http() as c:
        for step in range(3, 8):
            again = await c.get("/batch", params={"step": step})
            assert again.status_code == 200 and again.content == served[step], step
            assert again.headers["x-atropos-step"] == str(step)
        gone = await c.get("/batch", params={"step": 2})
        assert gone.status_code == 409
        assert gone.headers["x-atropos-oldest-step"] == "3"
        assert "the oldest step it can answer again is 3" in gone.json()["detail"]
        assert (await c.get("/status")).json()["current_step"] == 7


@pytest.mark.parametrize("db", [False, True], ids=["memory", "db"])
async def test_last_k_batches_answer_again_and_older_ones_name_the_oldest(tmp_path, db) -> None:
    server = Server(tmp_path / "q.db" if db else None)
    async with server.http() as c:
        # checkpoint every 3 steps: the last 3 + 2 batches are kept
        await start_trainer(c, batch_size=2, save_checkpoint_interval=3)
        await fill(c, 7)
        served = {}
        for step in range(1, 8):
            r = await c.get("/batch")
            assert r.headers["x-atropos-step"] == str(step)
            served[step] = r.content
    await check_kept(server, served)
    if db:  # and after a restart
        server.restart()
        await check_kept(server, served)
    server.app.state.api.close()


async def test_a_resumed_trainer_gets_every_served_group_into_training_exactly_once(tmp_path) -> None:
    """Trainer A trains steps 1-4 (checkpoint at 4), fetches 5 and 6, and dies; B resumes at 4."""
    server = Server(tmp_path / "q.db")
    first = server.client()
    await first.register(Registration(**{**REGISTRATION, "batch_size": 2,
                                         "save_checkpoint_interval": 4}))
    async with server.http() as c:
        await c.get("/batch")  # the first poll lets envs register
        await fill(c, 10)
    trained = Counter()
    for _ in range(4):
        trained.update(tokens_of(await first.get_batch()))
    lost_with_the_crash = [await first.get_batch(), await first.get_batch()]  # steps 5, 6
    assert first.last_step == 6 and all(lost_with_the_crash)
    server.restart()  # the server restarted too (kill -9 is covered over HTTP below)

    second = server.client()
    await second.register(Registration(**{**REGISTRATION, "batch_size": 2,
                                          "save_checkpoint_interval": 4, "starting_step": 4}))
    steps = []
    while (batch := await second.get_batch()) is not None:
        trained.update(tokens_of(batch))
        steps.append(second.last_step)
    assert steps == [5, 6, 7, 8, 9, 10]  # the two lost steps again, then new ones
    assert sorted(trained.values()) == [1] * 10  # every group once
    assert set(trained) == {tuple(map(tuple, make_group(2, seed=i)["tokens"])) for i in range(10)}
    server.app.state.api.close()


def test_kept_batches_survive_kill_9_of_a_real_run_api(tmp_path) -> None:
    db = tmp_path / "q.db"
    api = start_run_api("--replay-batches", "3", db=db)
    try:
        httpx.post(api.url + "/register", json={**REGISTRATION, "batch_size": 2}).raise_for_status()
        httpx.get(api.url + "/batch")
        for i in range(4):
            httpx.post(api.url + "/scored_data", json=make_group(2, seed=i)).raise_for_status()
        served = [httpx.get(api.url + "/batch").content for _ in range(4)]
        api.kill()
        api = start_run_api(db=db, port=api.port)  # --replay-batches back to the default
        # a resuming trainer (checkpoint at step 1) registers again: no renumbering
        r = httpx.post(api.url + "/register", json={**REGISTRATION, "batch_size": 2,
                                                    "starting_step": 1})
        assert r.json()["current_step"] == 4 and r.json()["oldest_replayable_step"] == 2
        with AtroposClient(api.url) as trainer:
            trainer.register(Registration(**{**REGISTRATION, "batch_size": 2, "starting_step": 1}))
            again = [trainer.get_batch() for _ in range(3)]
            assert trainer.last_step == 4 and trainer.get_batch() is None
        assert [httpx.get(api.url + "/batch", params={"step": s}).content
                for s in (2, 3, 4)] == served[1:]
        assert tokens_of(again[0]) == [tuple(map(tuple, make_group(2, seed=1)["tokens"]))]
    finally:
        api.stop()
    assert "Traceback" not in api.log()


async def test_atropos_0_4_trainer_on_a_fresh_server_behaves_as_before() -> None:
    app = make_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        r = await c.post("/register", json=REGISTRATION)  # the eight stock fields
        assert isinstance(r.json()["uuid"], int) and r.json()["current_step"] == 0
        assert (await c.get("/batch")).json() == {"batch": None}
        for i in range(4):
            await c.post("/scored_data", json=make_group(2, seed=i))
        steps = [(await c.get("/batch")).headers["x-atropos-step"] for _ in range(2)]
        assert steps == ["1", "2"]
        # a stock trainer restarted registers step 0 again: the numbering goes on (Atropos 0.4
        # ignored a second /register altogether)
        await register(c)
        assert (await c.get("/status")).json()["current_step"] == 2


async def test_client_skips_steps_no_longer_kept_with_a_warning(caplog) -> None:
    app = make_app(replay_batches=2)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await start_trainer(c, batch_size=2)
        await fill(c, 6)
        for _ in range(5):
            await c.get("/batch")
    trainer = AsyncAtroposClient("http://api", transport=httpx.ASGITransport(app=app))
    with caplog.at_level(logging.WARNING, logger="atroposlib"):
        await trainer.register(Registration(**{**REGISTRATION, "batch_size": 2, "starting_step": 1}))
    assert "steps 2..3" in caplog.text and "continuing from step 4" in caplog.text
    assert trainer.last_step == 3
    got = [await trainer.get_batch() for _ in range(3)]
    assert trainer.last_step == 6 and all(got)
    assert tokens_of(got[2]) == tokens_of([make_group(2, seed=5)])


def test_replay_window_follows_the_checkpoint_interval() -> None:
    def window(settings: dict, interval: int) -> int:
        state = ApiState(ApiSettings(**settings))
        state.register(Registration(**{**REGISTRATION, "save_checkpoint_interval": interval}))
        return state.core.replay_batches

    assert window({}, 10) == 12
    assert window({}, 0) == window({}, -1) == 1  # no checkpoints: the last batch, as before
    assert window({}, 1000) == REPLAY_BATCHES_CAP
    assert window({"replay_batches": 500}, 10) == 500


def test_a_schema_2_database_keeps_its_last_batch(tmp_path) -> None:
    state = ApiState(ApiSettings(db=tmp_path / "q.db"))
    state.register(Registration(**{**REGISTRATION, "batch_size": 2}))
    state.next_batch()
    state.ingest([ScoredData(**make_group(2))])
    body, _ = state.next_batch()
    state.close()
    store = SqliteStore(tmp_path / "q.db")  # what a schema-2 server left: meta, no batches table
    with store.transaction():
        store.delete_batches([1])
        store.set_meta("last_batch", {"step": 1, "ids": [1]})
    store.close()
    again = ApiState(ApiSettings(db=tmp_path / "q.db"))
    assert again.batch_for_step(1)[0] == body
    with pytest.raises(StepConflictError, match="oldest step it can answer again is 1"):
        again.batch_for_step(0)
    again.close()
