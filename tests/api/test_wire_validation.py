"""Wire validation: bad numbers and shapes get 422 (never 500), nothing accepted can break the
server later, and a failed request stores nothing; in memory and with ``--db`` alike."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from jsonschema import Draft202012Validator

from atroposlib.api.codec import encode_group
from atroposlib.api.models import INT64_MAX, MAX_SIZE, RegisterEnv, Registration, ScoredData
from atroposlib.api.settings import ApiSettings
from atroposlib.api.state import ApiState

from .conftest import REGISTRATION, make_app, make_group, register, register_env, start_trainer

BIG = 2**64  # does not fit a signed (or unsigned) 64-bit integer


@pytest.fixture(params=["memory", "sqlite"])
async def any_client(request, tmp_path) -> AsyncIterator[httpx.AsyncClient]:
    """In-process client of a fresh app, in memory and with a SQLite ``--db``."""
    db = tmp_path / "q.db" if request.param == "sqlite" else None
    app = make_app(db=db)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
        c.app = app  # type: ignore[attr-defined]
        yield c
    app.state.api.close()


def raw(group: dict, **fields: str) -> bytes:
    """``group`` as JSON with some fields replaced by raw JSON text (NaN, 1e309, 2**64...)."""
    body = orjson.dumps(group)[:-1]
    for name, text in fields.items():
        body += b',"%s":%s' % (name.encode(), text.encode())
    return body + b"}"


async def post_raw(c: httpx.AsyncClient, path: str, body: bytes) -> httpx.Response:
    return await c.post(path, content=body, headers={"Content-Type": "application/json"})


async def assert_still_healthy(c: httpx.AsyncClient) -> None:
    for path in ("/status", "/info", "/wandb_info", "/latest_example", "/batch"):
        response = await c.get(path)
        assert response.status_code == 200, (path, response.text)


@pytest.mark.parametrize("path", ["/scored_data", "/scored_data_list"])
@pytest.mark.parametrize("messages", ["false", "1.5", "[false]", "[[1]]", '"x"'])
async def test_messages_of_the_wrong_type_get_422(any_client, path, messages) -> None:
    body = raw(make_group(2), messages=messages)
    if path == "/scored_data_list":
        body = b"[" + body + b"]"
    response = await post_raw(any_client, path, body)
    assert response.status_code == 422, response.text
    assert "messages" in response.text
    assert (await any_client.get("/status")).json()["queue_size"] == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tokens", f"[[{BIG}, 1], [1, 1]]"),
        ("tokens", "[[-1, 1], [1, 1]]"),
        ("masks", f"[[-100, {BIG}], [-100, 1]]"),
        ("masks", f"[[-100, {-BIG}], [-100, 1]]"),
        ("generation_params", f'{{"temperature": 1.0, "seed": {BIG}}}'),
        ("messages", f'[[{{"role": "user", "content": "x", "id": {BIG}}}], []]'),
        ("overrides", f'[{{"temperature": {BIG}}}, {{}}]'),
        ("group_overrides", f'{{"group_size": {BIG}}}'),
        ("images", f'["data:image/png;base64,AAAA", [{-BIG}]]'),
        ("env_id", str(BIG)),
        ("distill_token_ids", f"[[[{BIG}], [1]], [[1], [1]]]"),
        ("generation_params", '{"temperature": NaN}'),
        ("overrides", '[{"temperature": 1e309}, {}]'),
        ("scores", "[NaN, 1.0]"),
        ("scores", "[true, 1.0]"),
    ],
)
async def test_out_of_range_numbers_anywhere_get_422(any_client, field, value) -> None:
    await register(any_client)
    group = make_group(2, length=2)
    if field == "distill_token_ids":
        group["distill_logprobs"] = [[[-1.0], [-1.0]], [[-1.0], [-1.0]]]
    group.pop(field, None)
    for path, body in (("/scored_data", raw(group, **{field: value})),
                       ("/scored_data_list", b"[" + raw(make_group(2, seed=1)) + b","
                        + raw(group, **{field: value}) + b"]")):
        response = await post_raw(any_client, path, body)
        assert response.status_code == 422, (path, response.text)
        assert field in response.text
    assert (await any_client.get("/status")).json()["queue_size"] == 0
    await assert_still_healthy(any_client)


async def test_largest_free_form_integers_round_trip(any_client) -> None:
    await register(any_client, batch_size=2)
    group = make_group(2, generation_params={"seed": INT64_MAX, "low": -INT64_MAX - 1},
                       images=[[0, INT64_MAX]])
    assert (await any_client.post("/scored_data", json=group)).status_code == 200
    latest = (await any_client.get("/latest_example")).json()
    assert latest["generation_params"] == group["generation_params"]
    assert latest["images"] == group["images"]
    assert (await any_client.get("/batch")).json()["batch"][0]["tokens"] == group["tokens"]


@pytest.mark.parametrize("field", ["advantages", "inference_logprobs", "ref_logprobs"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e309", "-1e309"])
async def test_non_finite_per_token_floats_get_422(any_client, field, value) -> None:
    group = make_group(2, length=3)
    group.pop(field, None)
    response = await post_raw(any_client, "/scored_data",
                              raw(group, **{field: f"[[1.0, 1.0, {value}], [1.0, 1.0, -0.5]]"}))
    assert response.status_code == 422, response.text
    assert f"{field}" in response.text and "finite" in response.text


async def test_masked_logprob_placeholder_is_accepted_and_served_unchanged(any_client) -> None:
    await register(any_client, batch_size=2)
    group = make_group(2, length=4)  # 1.0 (the documented placeholder) at the masked prompt
    group["advantages"] = [[0.0, 0.0, 0.5, -0.25]] * 2
    group["ref_logprobs"] = [[1.0, 1.0, -0.5, -1.5]] * 2
    assert (await any_client.post("/scored_data", json=group)).status_code == 200
    served = (await any_client.get("/batch")).json()["batch"][0]
    for name in ("inference_logprobs", "advantages", "ref_logprobs"):
        assert served[name] == group[name]


@pytest.mark.parametrize(
    ("field", "value"),
    [("starting_step", BIG), ("max_token_len", BIG), ("batch_size", BIG),
     ("starting_step", MAX_SIZE + 1), ("batch_size", 0), ("max_token_len", -1),
     ("num_steps", BIG), ("save_checkpoint_interval", -2), ("batch_size", True),
     ("batch_size", "4"), ("batch_size", 4.5)],
)
async def test_registration_numbers_are_bounded(any_client, field, value) -> None:
    response = await any_client.post("/register", json={**REGISTRATION, field: value})
    assert response.status_code == 422, response.text
    assert field in response.text
    await assert_still_healthy(any_client)
    assert (await any_client.get("/info")).json() == {"batch_size": -1, "max_token_len": -1}


async def test_registration_bounds_are_inclusive(any_client) -> None:
    body = {**REGISTRATION, "batch_size": 4.0, "starting_step": MAX_SIZE, "num_steps": -1,
            "save_checkpoint_interval": 0, "max_token_len": MAX_SIZE}
    assert (await any_client.post("/register", json=body)).status_code == 200
    assert (await any_client.get("/status")).json()["current_step"] == MAX_SIZE
    assert (await any_client.get("/info")).json() == {"batch_size": 4, "max_token_len": MAX_SIZE}


@pytest.mark.parametrize(
    ("field", "value"),
    [("weight", "NaN"), ("weight", "Infinity"), ("weight", "1e309"), ("weight", "-1"),
     ("min_batch_allocation", "NaN"), ("min_batch_allocation", "1.5"),
     ("max_token_length", "1e309"), ("max_token_length", str(BIG)), ("max_token_length", "0"),
     ("group_size", str(BIG)), ("group_size", "true")],
)
async def test_env_registration_numbers_are_bounded(any_client, field, value) -> None:
    await start_trainer(any_client)
    first = await register_env(any_client, name="good")
    body = {"max_token_length": 256, "desired_name": "bad", "weight": 1.0, "group_size": 2,
            "min_batch_allocation": None}
    body.pop(field)
    response = await post_raw(any_client, "/register-env", raw(body, **{field: value}))
    assert response.status_code == 422, response.text
    assert field in response.text
    assert (await any_client.get("/status-env", params={"env_id": first})).status_code == 200
    assert (await any_client.get("/status-env", params={"env_id": first + 1})).status_code == 404


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_scored_data_list_is_all_or_none_when_storing_fails(tmp_path, monkeypatch, store) -> None:
    """A failure while storing the 3rd group of a list leaves no trace of the first two."""
    state = ApiState(ApiSettings(db=tmp_path / "q.db" if store == "sqlite" else None))
    state.register(Registration(**{**REGISTRATION, "batch_size": 2}))
    state.next_batch()
    env = state.register_env(RegisterEnv(max_token_length=64, desired_name="e", weight=1.0,
                                         group_size=2))["env_id"]
    state.ingest([ScoredData(**make_group(2, env_id=env, seed=0))])
    before = (state.status(), state.latest_example(), state.observe(0, 100),
              state.store.load().partials)
    calls = 0

    def failing_encode(group):
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("disk full")
        return encode_group(group)

    monkeypatch.setattr("atroposlib.api.ingestion.encode_group", failing_encode)
    groups = [ScoredData(**make_group(n, env_id=env, seed=10 + n)) for n in (2, 1, 2)]
    with pytest.raises(RuntimeError, match="disk full"):
        state.ingest(groups)
    monkeypatch.undo()
    after = (state.status(), state.latest_example(), state.observe(0, 100),
             state.store.load().partials)
    assert after == before
    assert state.buffered_groups == 0
    state.close()
    reopened = ApiState(ApiSettings(db=tmp_path / "q.db")) if store == "sqlite" else None
    if reopened is not None:
        assert reopened.status() == before[0]
        reopened.close()


async def test_scored_data_list_500_stores_nothing_over_http(any_client, monkeypatch) -> None:
    await register(any_client, batch_size=2)
    calls = 0

    def failing_encode(group):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("disk full")
        return encode_group(group)

    monkeypatch.setattr("atroposlib.api.ingestion.encode_group", failing_encode)
    response = await any_client.post("/scored_data_list",
                                     json=[make_group(2, seed=0), make_group(2, seed=1)])
    assert response.status_code == 500
    monkeypatch.undo()
    assert (await any_client.get("/status")).json()["queue_size"] == 0
    assert (await any_client.get("/observe")).json()["groups"] == []
    assert (await any_client.get("/batch")).json()["batch"] is None


async def test_latest_example_placeholder_matches_its_documented_schema(client) -> None:
    schema = (await client.get("/openapi.json")).json()
    documented = schema["paths"]["/latest_example"]["get"]["responses"]["200"]["content"][
        "application/json"]["schema"]
    validator = Draft202012Validator({**documented, "components": schema["components"]})
    placeholder = (await client.get("/latest_example")).json()
    assert placeholder["generation_params"] == []
    validator.validate(placeholder)
    await register(client, batch_size=2)
    assert (await client.post("/scored_data", json=make_group(2))).status_code == 200
    validator.validate((await client.get("/latest_example")).json())


async def test_status_env_takes_the_id_from_the_query_or_a_body(client) -> None:
    await start_trainer(client)
    env = await register_env(client)
    by_query = await client.get("/status-env", params={"env_id": env})
    by_body = await client.request("GET", "/status-env", json={"env_id": env})
    assert by_query.status_code == by_body.status_code == 200
    assert by_query.json().keys() == by_body.json().keys()
    missing = await client.get("/status-env")
    assert missing.status_code == 422 and "env_id is required" in missing.text
    bad_body = await client.request("GET", "/status-env", json={"env_id": True})
    assert bad_body.status_code == 422 and "env_id" in bad_body.text
    doc = (await client.get("/openapi.json")).json()["paths"]["/status-env"]["get"]
    assert {"404", "422"} <= set(doc["responses"])
    (param,) = doc["parameters"]
    assert param["schema"]["type"] == "integer"  # no `?env_id=null`


async def test_method_not_allowed_lists_every_method_of_the_path(client) -> None:
    response = await client.request("OPTIONS", "/reset_data")
    assert response.status_code == 405
    assert {m.strip() for m in response.headers["allow"].split(",")} >= {"GET", "POST"}
    assert (await client.put("/register")).headers["allow"] == "POST"


async def test_guard_errors_are_documented() -> None:
    for key, expected_401 in ((None, False), ("s3cret", True)):
        app = make_app(api_key=key)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://api") as c:
            schema = (await c.get("/openapi.json")).json()
        for path, operations in schema["paths"].items():
            for method, operation in operations.items():
                codes = set(operation["responses"])
                assert {"400", "413"} <= codes, (path, method)
                assert ("415" in codes) == (method == "post"), (path, method)
                public = path == "/"
                assert ("401" in codes) == (expected_401 and not public), (path, method)
                if expected_401 and public:
                    assert operation["security"] == []
        paths = schema["paths"]
        assert "403" in paths["/reset_data"]["get"]["responses"]
        assert "404" in paths["/disconnect-env"]["post"]["responses"]
        assert {"404", "413", "422", "429"} <= set(paths["/scored_data_list"]["post"]["responses"])


async def test_advantages_rows_longer_than_their_sequence_are_cut_to_it(any_client) -> None:
    """Atropos 0.4 accepted an ``advantages`` row longer than its tokens row; the entries past
    the sequence belong to no token and are cut off. Shorter rows (and other fields) still 422."""
    await register(any_client, batch_size=2)
    group = make_group(2, length=3)
    group["advantages"] = [[0.5, 0.25, 0.125, 9.0], [1.0, 2.0, 3.0]]
    assert (await any_client.post("/scored_data", json=group)).status_code == 200
    served = (await any_client.get("/batch")).json()["batch"][0]
    assert served["advantages"] == [[0.5, 0.25, 0.125], [1.0, 2.0, 3.0]]
    for field, rows in (("advantages", [[0.5, 0.25], [1.0, 2.0, 3.0]]),
                        ("ref_logprobs", [[-0.5, -0.5, -0.5, -0.5]] * 2)):
        bad = {**make_group(2, length=3), field: rows}
        response = await any_client.post("/scored_data", json=bad)
        assert response.status_code == 422 and f"{field}[0] has" in response.text
