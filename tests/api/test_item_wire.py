"""A group's dataset item on the wire: validated, size-bounded, stored and served back.

Stock groups (no ``item``) are served with exactly their 14 keys; a group with an item gets it
back in ``/batch`` and ``/latest_example``, in memory and with ``--db`` (through a restart too),
and partial groups merge only with parts of the same item.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from atroposlib.api.models import GROUP_FIELDS, MAX_ITEM_BYTES, ScoredData

from .conftest import make_app, make_group, register_env, start_trainer

ITEM = {"question": "What is 57 + 12?", "answer": 69, "tags": ["add", "2-digit"], "w": 0.5}


@pytest.fixture(params=["memory", "sqlite"])
async def any_client(request, tmp_path) -> AsyncIterator[httpx.AsyncClient]:
    db = tmp_path / "q.db" if request.param == "sqlite" else None
    app = make_app(db=db)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        yield c
    app.state.api.close()


def test_item_is_optional_and_not_one_of_the_14_keys() -> None:
    assert ScoredData(**make_group(2)).item is None
    assert ScoredData(**make_group(2, item=ITEM)).item == ITEM
    assert "item" not in GROUP_FIELDS and len(GROUP_FIELDS) == 14


async def test_item_is_served_back_and_stock_groups_keep_their_14_keys(any_client) -> None:
    await start_trainer(any_client, batch_size=2)
    with_item = make_group(2, seed=1, item=ITEM)
    assert (await any_client.post("/scored_data", json=make_group(2))).status_code == 200
    assert (await any_client.post("/scored_data", json=with_item)).status_code == 200
    latest = (await any_client.get("/latest_example")).json()
    assert latest["item"] == ITEM
    stock = (await any_client.get("/batch")).json()["batch"][0]
    assert list(stock) == list(GROUP_FIELDS)
    served = (await any_client.get("/batch")).json()["batch"][0]
    assert list(served) == [*GROUP_FIELDS, "item"]
    assert served["item"] == ITEM and served["tokens"] == with_item["tokens"]


async def test_any_json_value_is_an_item(any_client) -> None:
    await start_trainer(any_client, batch_size=1)
    for seed, item in enumerate(["plain text", 7, [1, "two", None], {"nested": {"a": [True]}}]):
        assert (await any_client.post("/scored_data", json=make_group(1, seed=seed, item=item))
                ).status_code == 200
        assert (await any_client.get("/batch")).json()["batch"][0]["item"] == item


@pytest.mark.parametrize("path", ["/scored_data", "/scored_data_list"])
async def test_an_item_past_the_size_bound_gets_a_clear_422(any_client, path) -> None:
    await start_trainer(any_client, batch_size=2)
    largest = "x" * (MAX_ITEM_BYTES - 2)  # JSON adds the two quotes
    assert len(orjson.dumps(largest)) == MAX_ITEM_BYTES
    too_big = make_group(2, item={"text": largest})
    body = [make_group(2, seed=1), too_big] if path == "/scored_data_list" else too_big
    response = await any_client.post(path, json=body)
    assert response.status_code == 422, response.text
    assert "item" in response.text and f"more than the {MAX_ITEM_BYTES}" in response.text
    assert "send a smaller item" in response.text
    assert (await any_client.get("/status")).json()["queue_size"] == 0
    ok = await any_client.post("/scored_data", json=make_group(2, item=largest))
    assert ok.status_code == 200, ok.text
    assert (await any_client.get("/batch")).json()["batch"][0]["item"] == largest


@pytest.mark.parametrize("value", [f'{{"id": {2**64}}}', '{"w": NaN}', '[1e309]'])
async def test_numbers_json_cannot_carry_back_get_422(any_client, value) -> None:
    body = orjson.dumps(make_group(2))[:-1] + b',"item":' + value.encode() + b"}"
    response = await any_client.post("/scored_data", content=body,
                                     headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert "item" in response.text
    assert (await any_client.get("/status")).json()["queue_size"] == 0


async def test_partial_groups_merge_only_with_parts_of_the_same_item(any_client) -> None:
    await start_trainer(any_client, batch_size=4)
    env_id = await register_env(any_client, group_size=4)
    a = make_group(2, env_id=env_id, seed=1, item=ITEM)
    other = make_group(2, env_id=env_id, seed=2, item={**ITEM, "answer": 70})
    b = make_group(2, env_id=env_id, seed=3, item=ITEM)
    for part in (a, other, b):
        assert (await any_client.post("/scored_data", json=part)).json()["status"] == "buffered"
    batch = (await any_client.get("/batch")).json()["batch"]
    assert len(batch) == 1 and batch[0]["item"] == ITEM
    assert batch[0]["tokens"] == a["tokens"] + b["tokens"]


async def test_item_survives_a_restart_with_db(tmp_path) -> None:
    db = tmp_path / "q.db"
    app = make_app(db=db)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await start_trainer(c, batch_size=2)
        assert (await c.post("/scored_data", json=make_group(2, item=ITEM))).status_code == 200
    app.state.api.close()
    app = make_app(db=db)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        assert (await c.get("/batch")).json()["batch"][0]["item"] == ITEM
    app.state.api.close()
