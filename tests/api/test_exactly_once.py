"""Exactly once across lost replies: ``Idempotency-Key`` on the scored-data POSTs and
``GET /batch?step=N``, in memory and with ``--db`` (also across a reopen of the database)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from atroposlib.api.client import AsyncAtroposClient
from atroposlib.api.factory import build_app
from atroposlib.api.models import Registration
from atroposlib.api.settings import ApiSettings
from atroposlib.errors import ApiRejectedError, ApiUnavailableError
from tests.fixtures.lossy import LoseReplies, first_n

from .conftest import REGISTRATION, make_group, register, start_trainer


class Server:
    """An in-process app that can be 'restarted' on the same database (or lost without one)."""

    def __init__(self, db, **settings):
        settings.setdefault("allowed_hosts", ["api"])  # the in-process clients' base URL
        self.settings = ApiSettings(db=db, **settings)
        self.app = build_app(self.settings)

    def restart(self) -> None:
        self.app.state.api.close()
        self.app = build_app(self.settings)

    def http(self, **kw) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://api", **kw)

    def client(self, lose=None, before=False, max_attempts=3) -> AsyncAtroposClient:
        transport = httpx.ASGITransport(app=self.app)
        if lose is not None:
            transport = LoseReplies(transport, lose, before)
        return AsyncAtroposClient("http://api", transport=transport, max_attempts=max_attempts)


@pytest.fixture(params=["memory", "db"])
async def server(request, tmp_path) -> AsyncIterator[Server]:
    s = Server(tmp_path / "q.db" if request.param == "db" else None)
    yield s
    s.app.state.api.close()


async def queued(s: Server) -> int:
    async with s.http() as c:
        return (await c.get("/status")).json()["queue_size"]


# ---------------------------------------------------------------------------- Idempotency-Key
async def test_repeated_key_gets_the_first_answer_and_stores_once(server: Server) -> None:
    async with server.http() as c:
        await register(c, batch_size=4)
        headers = {"Idempotency-Key": "k1"}
        first = await c.post("/scored_data", json=make_group(2), headers=headers)
        again = await c.post("/scored_data", json=make_group(2), headers=headers)
        assert first.status_code == again.status_code == 200
        assert first.content == again.content == b'{"status":"received"}'
        assert "idempotent-replayed" not in first.headers
        assert again.headers["idempotent-replayed"] == "true"
        groups = [make_group(1, seed=1), make_group(2, seed=2)]
        listed = [await c.post("/scored_data_list", json=groups, headers={"Idempotency-Key": "k2"})
                  for _ in range(3)]
        assert {r.content for r in listed} == {b'{"status":"received","groups_processed":2}'}
        # the same key on the other route is another request
        other = await c.post("/scored_data_list", json=[make_group(2)], headers=headers)
        assert other.status_code == 200 and "idempotent-replayed" not in other.headers
        assert (await c.get("/status")).json()["queue_size"] == 4
        # stock clients (no header) are unaffected: two POSTs, two groups
        for _ in range(2):
            assert (await c.post("/scored_data", json=make_group(2))).status_code == 200
        assert (await c.get("/status")).json()["queue_size"] == 6


async def test_key_reused_for_another_body_or_empty_is_refused(server: Server) -> None:
    async with server.http() as c:
        await register(c)
        headers = {"Idempotency-Key": "same"}
        assert (await c.post("/scored_data", json=make_group(2), headers=headers)).status_code == 200
        reused = await c.post("/scored_data", json=make_group(2, seed=5), headers=headers)
        assert reused.status_code == 422 and "different request body" in reused.json()["detail"]
        empty = await c.post("/scored_data", json=make_group(2), headers={"Idempotency-Key": ""})
        assert empty.status_code == 422 and "empty" in empty.json()["detail"]
        long = await c.post("/scored_data", json=make_group(2), headers={"Idempotency-Key": "k" * 256})
        assert long.status_code == 422
        assert (await c.get("/status")).json()["queue_size"] == 1


async def test_refused_posts_are_not_remembered(tmp_path) -> None:
    s = Server(None, max_queued_groups=1)
    async with s.http() as c:
        await register(c)
        assert (await c.post("/scored_data", json=make_group(2, seed=9))).status_code == 200
        headers = {"Idempotency-Key": "k"}
        assert (await c.post("/scored_data", json=make_group(2), headers=headers)).status_code == 429
        assert (await c.get("/batch")).json()["batch"] is None  # batch_size 4: nothing served
        await register(c, batch_size=2)
        assert len((await c.get("/batch")).json()["batch"]) == 1  # room again
        retried = await c.post("/scored_data", json=make_group(2), headers=headers)
        assert retried.status_code == 200 and "idempotent-replayed" not in retried.headers
        assert (await c.get("/status")).json()["queue_size"] == 1


async def test_keys_are_bounded_and_survive_a_restart_with_db(tmp_path) -> None:
    s = Server(tmp_path / "q.db", idempotency_keys=2)
    async with s.http() as c:
        await register(c)
        for key in ("a", "b", "c"):  # "a" is forgotten when "c" comes
            await c.post("/scored_data", json=make_group(2), headers={"Idempotency-Key": key})
    s.restart()
    async with s.http() as c:
        for key in ("b", "c"):
            r = await c.post("/scored_data", json=make_group(2), headers={"Idempotency-Key": key})
            assert r.headers["idempotent-replayed"] == "true"
        assert (await c.get("/status")).json()["queue_size"] == 3
        r = await c.post("/scored_data", json=make_group(2), headers={"Idempotency-Key": "a"})
        assert "idempotent-replayed" not in r.headers
        assert (await c.get("/status")).json()["queue_size"] == 4
        await c.get("/reset_data")  # forgets the keys with everything else
        r = await c.post("/scored_data", json=make_group(2), headers={"Idempotency-Key": "c"})
        assert "idempotent-replayed" not in r.headers
    s.app.state.api.close()


async def test_client_retry_after_a_lost_reply_stores_once(server: Server) -> None:
    async with server.http() as c:
        await register(c)
    client = server.client(lose=first_n("/scored_data"))
    assert await client.post_scored_data(make_group(2)) == {"status": "received"}
    assert client._http._transport.lost  # the first reply really was lost
    lose_list = server.client(lose=first_n("/scored_data_list", 2))
    reply = await lose_list.post_scored_data_list([make_group(2, seed=1), make_group(2, seed=2)])
    assert reply == {"status": "received", "groups_processed": 2}
    assert await queued(server) == 3


# ---------------------------------------------------------------------------- GET /batch?step=N
async def fill(c: httpx.AsyncClient, n: int) -> None:
    for i in range(n):
        assert (await c.post("/scored_data", json=make_group(2, seed=i))).status_code == 200


async def test_batch_of_a_step_is_answered_again_until_the_next_is_served(server: Server) -> None:
    server.settings = server.settings.model_copy(update={"replay_batches": 1})  # the last only
    server.restart()
    async with server.http() as c:
        await start_trainer(c, batch_size=2, starting_step=5)
        await fill(c, 3)
        assert (await c.get("/batch", params={"step": 6})).headers["x-atropos-step"] == "6"
        plain = await c.get("/batch")
        assert plain.headers["x-atropos-step"] == "7"
        assert (await c.get("/status")).json() == {"current_step": 7, "queue_size": 1}
        for _ in range(2):
            again = await c.get("/batch", params={"step": 7})
            assert again.content == plain.content and again.headers["x-atropos-step"] == "7"
        assert (await c.get("/status")).json() == {"current_step": 7, "queue_size": 1}
        older = await c.get("/batch", params={"step": 6})
        assert older.status_code == 409 and "?step=8 serves the next" in older.json()["detail"]
        ahead = await c.get("/batch", params={"step": 9})
        assert ahead.status_code == 409 and "ahead" in ahead.json()["detail"]
        third = await c.get("/batch", params={"step": 8})
        assert third.headers["x-atropos-step"] == "8" and third.content != plain.content
        assert (await c.get("/batch", params={"step": 7})).status_code == 409
        null = await c.get("/batch", params={"step": 9})
        assert null.json() == {"batch": None} and "x-atropos-step" not in null.headers
        # registering again at an earlier step is a resume: no renumbering, the kept batch stays
        await register(c, batch_size=2, starting_step=0)
        assert (await c.get("/status")).json()["current_step"] == 8
        gone = await c.get("/batch", params={"step": 1})
        assert gone.status_code == 409 and "the oldest step it can answer again is 8" in gone.text
        assert gone.headers["x-atropos-oldest-step"] == "8"
        assert (await c.get("/batch", params={"step": 8})).content == third.content
        # a starting_step past the server's step renumbers and forgets the kept batches
        await register(c, batch_size=2, starting_step=20)
        assert (await c.get("/batch", params={"step": 20})).status_code == 409
        assert (await c.get("/batch", params={"step": 21})).json() == {"batch": None}


async def test_last_batch_survives_observe_pruning_and_a_restart_with_db(tmp_path) -> None:
    s = Server(tmp_path / "q.db", observe_retention_groups=0, observe_retention_tokens=0)
    async with s.http() as c:
        await start_trainer(c, batch_size=4)
        await fill(c, 3)
        served = await c.get("/batch")
    s.restart()
    async with s.http() as c:
        again = await c.get("/batch", params={"step": 1})
        assert again.status_code == 200 and again.content == served.content
        assert (await c.get("/status")).json() == {"current_step": 1, "queue_size": 1}
    s.app.state.api.close()


async def test_not_registered_answer_is_kept_for_step_queries(client: httpx.AsyncClient) -> None:
    r = await client.get("/batch", params={"step": 1})
    assert r.status_code == 200 and r.json()["status"] == "error"
    assert (await client.get("/batch", params={"step": -1})).status_code == 422


@pytest.mark.parametrize("before", [False, True], ids=["reply-lost", "request-lost"])
async def test_client_get_batch_loses_and_skips_no_batch(server: Server, before: bool) -> None:
    trainer = server.client(lose=first_n("/batch", 2), before=before)
    await trainer.register(Registration(**{**REGISTRATION, "batch_size": 2}))
    assert trainer.last_step == 0
    async with server.http() as c:
        await fill(c, 3)
    got = []
    while (batch := await trainer.get_batch()) is not None:
        got.extend(batch)
    assert len(trainer._http._transport.lost) == 2 and trainer.last_step == 3
    assert [g["tokens"] for g in got] == [make_group(2, seed=i)["tokens"] for i in range(3)]


async def test_client_call_that_failed_asks_for_its_step_next_time(server: Server) -> None:
    trainer = server.client(lose=first_n("/batch", 1), max_attempts=1)  # no retry in the call
    await trainer.register(Registration(**{**REGISTRATION, "batch_size": 2}))
    async with server.http() as c:
        await fill(c, 2)
    with pytest.raises(ApiUnavailableError, match="reply lost"):
        await trainer.get_batch()
    first = await trainer.get_batch()  # ?step=1: the batch the lost reply carried
    assert first is not None and first[0]["tokens"] == make_group(2, seed=0)["tokens"]
    assert trainer.last_step == 1


async def test_client_step_mismatch_is_a_clear_error(server: Server) -> None:
    trainer = server.client(lose=first_n("/batch", 1))
    await trainer.register(Registration(**{**REGISTRATION, "batch_size": 2}))
    trainer.last_step = 5  # e.g. another consumer took batches
    async with server.http() as c:
        await fill(c, 1)
    with pytest.raises(ApiRejectedError, match="ahead of the server"):
        await trainer.get_batch()


async def test_batch_bodies_are_plain_batches(server: Server) -> None:
    async with server.http() as c:
        await start_trainer(c, batch_size=2)
        await fill(c, 1)
        body = orjson.loads((await c.get("/batch", params={"step": 1})).content)
        assert list(body) == ["batch"] and body["batch"][0]["tokens"] == make_group(2)["tokens"]
