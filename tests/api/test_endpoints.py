"""Endpoint shapes and semantics, in process (httpx.ASGITransport): registration, data, batch and status routes."""

from __future__ import annotations

import gzip

import httpx
import orjson
import pytest

from atroposlib.api.models import GROUP_FIELDS

from .conftest import REGISTRATION, make_app, make_group, register, register_env, start_trainer

JSON = {"Content-Type": "application/json"}
GZ = {**JSON, "Content-Encoding": "gzip"}


async def test_root_info_wandb_status_before_registration(client: httpx.AsyncClient) -> None:
    assert (await client.get("/")).json() == {"message": "AtroposLib API"}
    assert (await client.get("/info")).json() == {"batch_size": -1, "max_token_len": -1}
    assert (await client.get("/wandb_info")).json() == {"group": None, "project": None}
    assert (await client.get("/status")).json() == {"current_step": 0, "queue_size": 0}
    assert (await client.get("/batch")).json() == {
        "status": "error", "message": "Trainer not registered. Call /register first.", "batch": []}
    assert (await client.get("/latest_example")).json() == {
        "tokens": [], "masks": [], "scores": [], "advantages": [], "ref_logprobs": [],
        "generation_params": [], "inference_logprobs": [], "messages": [], "images": []}


async def test_register_and_env_registration_flow(client: httpx.AsyncClient) -> None:
    response = (await client.post("/register", json=REGISTRATION)).json()
    assert isinstance(response["uuid"], int) and response["uuid"].bit_length() <= 128
    assert (await client.get("/info")).json() == {"batch_size": 4, "max_token_len": 256}
    assert (await client.get("/wandb_info")).json() == {"group": "grp", "project": "proj"}
    env_body = {"max_token_length": 256, "desired_name": "gsm8k", "weight": 1.0, "group_size": 2}
    assert (await client.post("/register-env", json=env_body)).json() == {
        "status": "wait for trainer to start"}
    assert (await client.get("/batch")).json() == {"batch": None}
    first = (await client.post("/register-env", json=env_body)).json()
    assert first == {"status": "success", "env_id": 0, "wandb_name": "gsm8k_0",
                     "checkpoint_dir": "ckpt", "starting_step": 0, "checkpoint_interval": 10,
                     "num_steps": 100}
    second = (await client.post("/register-env", json=env_body)).json()
    assert second["env_id"] == 1 and second["wandb_name"] == "gsm8k_1"
    assert (await client.post("/disconnect-env", json={"env_id": 1})).json() == {"status": "success"}
    missing = await client.post("/disconnect-env", json={"env_id": 7})
    assert missing.status_code == 404 and "register-env" in missing.json()["detail"]
    assert (await client.post("/register-env", json={**env_body, "weight": None})).status_code == 422


async def test_second_register_updates_settings_and_keeps_queue(client: httpx.AsyncClient) -> None:
    await register(client)
    await client.post("/scored_data", json=make_group(2))
    await register(client, batch_size=2, starting_step=7)
    assert (await client.get("/info")).json()["batch_size"] == 2
    assert (await client.get("/status")).json() == {"current_step": 7, "queue_size": 1}
    assert len((await client.get("/batch")).json()["batch"]) == 1


async def test_data_posted_before_register_does_not_block_registration(client) -> None:
    await client.post("/scored_data", json=make_group(2))
    await register(client)
    assert (await client.get("/info")).json()["batch_size"] == 4


async def test_all_fields_come_back_verbatim(client: httpx.AsyncClient) -> None:
    await start_trainer(client, batch_size=2)
    env_id = await register_env(client, group_size=2)
    group = make_group(
        2, env_id=env_id,
        advantages=[[0.1, -0.2, 0.3, 0.0, 1e-300], [1, 2, 3, 4, 5]],
        ref_logprobs=[[-1.5] * 5, [-2.5] * 5],
        messages=[[{"role": "system", "content": "s", "reward": None, "extra": {"k": [1]}}],
                  [{"role": "dog", "content": [{"type": "text", "text": "woof"}]}]],
        generation_params={"temperature": 0.7, "top_p": None},
        overrides=[{"set_advantage_to_zero": True}, {}],
        group_overrides={"group_size": 2, "task_id": "t1"},
        images=["data:image/png;base64,AAAA"],
        distill_token_ids=[[[1, 2]] * 5, [[3, 4]] * 5],
        distill_logprobs=[[[-0.1, -0.2]] * 5, [[-0.3, -0.4]] * 5],
        unknown_key="ignored",
    )
    assert (await client.post("/scored_data", json=group)).json() == {"status": "received"}
    latest = (await client.get("/latest_example")).json()
    served = (await client.get("/batch")).json()["batch"]
    assert len(served) == 1
    expected = {name: group.get(name) for name in GROUP_FIELDS}
    expected["scores"] = [float(s) for s in group["scores"]]
    expected["advantages"] = [[float(v) for v in row] for row in group["advantages"]]
    assert list(served[0]) == list(GROUP_FIELDS)
    assert served[0] == expected == latest


async def test_batch_is_exact_fifo_one_per_call_and_advances_step(client) -> None:
    await start_trainer(client, batch_size=2, starting_step=5)
    for i in range(6):
        await client.post("/scored_data", json=make_group(1, seed=i))
    seen = []
    for step in (6, 7, 8):
        batch = (await client.get("/batch")).json()["batch"]
        seen.append([g["tokens"] for g in batch])
        assert (await client.get("/status")).json() == {"current_step": step, "queue_size": 6 - 2 * (step - 5)}
    assert seen == [[make_group(1, seed=i)["tokens"] for i in (a, a + 1)] for a in (0, 2, 4)]
    assert (await client.get("/batch")).json() == {"batch": None}


async def test_mixed_group_sizes_never_wedge(client: httpx.AsyncClient) -> None:
    await start_trainer(client, batch_size=4)
    for i, n in enumerate([1, 1, 1, 1, 1, 3]):
        await client.post("/scored_data", json=make_group(n, seed=i))
    first = (await client.get("/batch")).json()["batch"]
    assert [len(g["tokens"]) for g in first] == [1, 1, 1, 1]
    await client.post("/scored_data", json=make_group(3, seed=9))  # queue now 1 + 3 + 3
    second = (await client.get("/batch")).json()["batch"]
    assert [len(g["tokens"]) for g in second] == [1, 3]
    assert "3 sequences queued" in (await client.get("/batch")).headers["x-atropos-wait-reason"]
    await client.post("/scored_data", json=make_group(3, seed=11))  # 3 + 3: no batch of 4
    stuck = await client.get("/batch")
    assert "no combination" in stuck.headers["x-atropos-wait-reason"]
    await client.post("/scored_data", json=make_group(1, seed=10))
    third = (await client.get("/batch")).json()["batch"]
    assert [len(g["tokens"]) for g in third] == [3, 1]


async def test_partial_groups_are_merged_into_one(client: httpx.AsyncClient) -> None:
    await start_trainer(client, batch_size=4)
    env_id = await register_env(client, group_size=4)
    a = make_group(1, env_id=env_id, seed=1)
    b = make_group(3, env_id=env_id, seed=2)
    assert (await client.post("/scored_data", json=a)).json() == {"status": "buffered", "buffer_size": 1}
    assert (await client.get("/status")).json()["queue_size"] == 0
    assert (await client.post("/scored_data", json=b)).json() == {"status": "buffered", "buffer_size": 0}
    assert (await client.get("/status")).json()["queue_size"] == 1
    batch = (await client.get("/batch")).json()["batch"]
    assert len(batch) == 1
    assert batch[0]["tokens"] == a["tokens"] + b["tokens"]
    assert batch[0]["inference_logprobs"] == a["inference_logprobs"] + b["inference_logprobs"]


async def test_oversize_group_is_rejected_with_reason(client: httpx.AsyncClient) -> None:
    await start_trainer(client, batch_size=8)
    env_id = await register_env(client, group_size=2)
    response = await client.post("/scored_data", json=make_group(4, env_id=env_id))
    assert response.status_code == 422 and "group_size" in response.json()["detail"]
    ok = make_group(4, env_id=env_id, group_overrides={"group_size": 4})
    assert (await client.post("/scored_data", json=ok)).json() == {"status": "received"}
    too_big = await client.post("/scored_data", json=make_group(9))
    assert too_big.status_code == 422 and "batch_size" in too_big.json()["detail"]
    partial_of_huge = make_group(2, env_id=env_id, group_overrides={"group_size": 16})
    response = await client.post("/scored_data", json=partial_of_huge)
    assert response.status_code == 422 and "batch_size" in response.json()["detail"]


async def test_partial_buffer_is_bounded_and_loses_nothing() -> None:
    app = make_app(max_buffered_groups_per_env=2)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await start_trainer(c, batch_size=6)
        env_id = await register_env(c, group_size=4)
        for i in range(3):  # 3+3 never makes 4
            await c.post("/scored_data", json=make_group(3, env_id=env_id, seed=i))
        assert (await c.get("/status")).json()["queue_size"] == 1  # oldest flushed, unmerged
        await c.post("/scored_data", json=make_group(3, env_id=env_id, seed=3))
        batch = (await c.get("/batch")).json()["batch"]
        assert [g["tokens"] for g in batch] == [make_group(3, seed=i)["tokens"] for i in (0, 1)]


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"masks": [[1], [2]]}, "masks[0]"),
        ({"scores": [1.0]}, "one row per sequence"),
        ({"inference_logprobs": [[1.0], [1.0]]}, "inference_logprobs[0]"),
        ({"messages": [[{"role": "user"}], [{"role": "user", "content": "x"}]]}, "'content'"),
        ({"tokens": [], "masks": [], "scores": []}, "at least one sequence"),
        ({"env_id": -1}, "whole number from 0 to"),
        ({"tokens": "nope"}, "list_type"),
        ({"distill_token_ids": [[[1]] * 3] * 2}, "send both"),
        ({"distill_token_ids": [[[1]] * 3] * 2, "distill_logprobs": [[[-1.0]] * 2] * 2},
         "distill_logprobs[0] have 3 / 2 positions"),
        ({"distill_token_ids": [[[1, 2]] * 3] * 2, "distill_logprobs": [[[-1.0]] * 3] * 2},
         "distill_token_ids[0][0] has 2 candidates"),
    ],
)
async def test_invalid_groups_get_422(client, change, fragment) -> None:
    response = await client.post("/scored_data", json={**make_group(2, length=3), **change})
    assert response.status_code == 422
    assert fragment in response.text
    assert (await client.get("/status")).json()["queue_size"] == 0


async def test_upstream_tolerance_is_kept(client: httpx.AsyncClient) -> None:
    group = make_group(2, messages=[[{"role": "USER", "content": {"a": 1}, "x": 1}], []],
                       whatever=1)
    group["messages"] = [[{"role": "USER", "content": {"a": 1}, "x": 1}],
                         [{"role": "dog", "content": ["list"]}]]
    assert (await client.post("/scored_data", json=group)).json() == {"status": "received"}
    assert (await client.post("/scored_data", json={**make_group(2), "messages": []})).status_code == 200
    assert (await client.post("/scored_data", content=b"{not json", headers=JSON)).json()["detail"][0]["type"] == "json_invalid"


async def test_unknown_env_id_is_rejected(client: httpx.AsyncClient) -> None:
    response = await client.post("/scored_data", json=make_group(2, env_id=3))
    assert response.status_code == 404 and "register-env" in response.json()["detail"]


async def test_scored_data_list(client: httpx.AsyncClient) -> None:
    await start_trainer(client)
    env_id = await register_env(client, group_size=4)
    body = [make_group(4), make_group(1, env_id=env_id), make_group(2, env_id=env_id)]
    assert (await client.post("/scored_data_list", json=body)).json() == {
        "status": "received", "groups_processed": 3, "buffered": 2, "last_buffer_size": 3}
    assert (await client.post("/scored_data_list", json=[])).json() == {
        "status": "received", "groups_processed": 0}
    bad = await client.post("/scored_data_list", json=[make_group(2), make_group(2, env_id=9)])
    assert bad.status_code == 404
    assert (await client.get("/status")).json()["queue_size"] == 1  # all or nothing


async def test_status_env_shapes_and_upstream_values(client: httpx.AsyncClient) -> None:
    await start_trainer(client, batch_size=8)
    a = await register_env(client, group_size=4, name="a", max_token_length=512, weight=1)
    b = await register_env(client, group_size=8, name="b", max_token_length=1024, weight=2)
    for n in (2, 2, 4):
        await client.post("/scored_data", json=make_group(n, env_id=a, group_overrides={"group_size": n}))
    await client.post("/scored_data", json=make_group(8, env_id=b))
    via_body = (await client.request("GET", "/status-env", json={"env_id": a})).json()
    via_query = (await client.get("/status-env", params={"env_id": a})).json()
    assert via_body == via_query
    assert via_body == {"current_step": 0, "queue_size": 4, "unallocated_fraction": 1.0,
                        "self_queue_size": 2, "max_group_size": 8, "env_weight": pytest.approx(0.2)}
    status_b = (await client.get("/status-env", params={"env_id": b})).json()
    assert (status_b["queue_size"], status_b["self_queue_size"], status_b["env_weight"]) == (
        2, 1, pytest.approx(0.8))
    unknown = await client.get("/status-env", params={"env_id": 5})
    assert unknown.status_code == 404 and "register-env" in unknown.json()["detail"]
    assert (await client.get("/status-env")).status_code == 422
    assert (await client.post("/status-env", json={"env_id": 0})).status_code == 405


async def test_status_env_no_500_when_all_disconnected_or_single_sequence_groups(client) -> None:
    await start_trainer(client, batch_size=4)
    a = await register_env(client, group_size=1, name="a", weight=0)
    b = await register_env(client, group_size=1, name="b", weight=0)
    await client.post("/scored_data", json=make_group(1, env_id=b))
    status = (await client.get("/status-env", params={"env_id": a})).json()
    assert status["queue_size"] == 1  # other envs' size-1 groups count (upstream ignored them)
    await client.post("/disconnect-env", json={"env_id": a})
    await client.post("/disconnect-env", json={"env_id": b})
    assert (await client.get("/status-env", params={"env_id": a})).status_code == 200


async def test_min_batch_allocation_shapes_batches(client: httpx.AsyncClient) -> None:
    await start_trainer(client, batch_size=4)
    a = await register_env(client, group_size=1, name="a")
    b = await register_env(client, group_size=1, name="b", min_batch_allocation=0.5)
    for i in range(4):
        await client.post("/scored_data", json=make_group(1, env_id=a, seed=i))
    waiting = await client.get("/batch")
    assert waiting.json() == {"batch": None}  # b's minimum not met yet
    assert "min_batch_allocation" in waiting.headers["x-atropos-wait-reason"]
    assert (await client.get("/status-env", params={"env_id": a})).json()["unallocated_fraction"] == 0.5
    for i in range(2):
        await client.post("/scored_data", json=make_group(1, env_id=b, seed=10 + i))
    batch = (await client.get("/batch")).json()["batch"]
    assert [g["env_id"] for g in batch] == [a, a, b, b]


async def test_reset_clears_everything_and_cursor_keeps_growing(client) -> None:
    await start_trainer(client)
    await client.post("/scored_data", json=make_group(2))
    cursor = (await client.get("/observe")).json()["next_cursor"]
    reset = await client.get("/reset_data")
    assert reset.status_code == 200 and reset.text == "Reset successful"
    assert reset.headers["content-type"].startswith("text/plain")
    assert (await client.get("/info")).json() == {"batch_size": -1, "max_token_len": -1}
    assert (await client.get("/status")).json() == {"current_step": 0, "queue_size": 0}
    assert (await client.get("/latest_example")).json()["tokens"] == []
    assert (await client.get("/batch")).json()["status"] == "error"  # upstream: 500
    await client.post("/scored_data", json=make_group(2))
    await register(client)
    observed = (await client.get("/observe", params={"after": 0})).json()
    assert [g["cursor"] for g in observed["groups"]] == [cursor + 1]
    assert (await client.get("/reset_data")).text == "Reset successful"  # twice is harmless


async def test_reset_refused_from_other_sites_pages(client: httpx.AsyncClient) -> None:
    response = await client.get("/reset_data", headers={"Sec-Fetch-Site": "cross-site"})
    assert response.status_code == 403


async def test_observe_reads_without_consuming(client: httpx.AsyncClient) -> None:
    await start_trainer(client, batch_size=2)
    env_id = await register_env(client, group_size=2)
    for i in range(3):
        await client.post("/scored_data", json=make_group(2, env_id=env_id if i else None, seed=i))
    page = (await client.get("/observe", params={"after": 0, "limit": 2})).json()
    assert [g["cursor"] for g in page["groups"]] == [1, 2] and page["next_cursor"] == 2
    assert page["groups"][0]["group"]["tokens"] == make_group(2, seed=0)["tokens"]
    assert set(page["groups"][0]) == {"cursor", "env_id", "received_at", "group"}
    assert list(page["groups"][0]["group"]) == list(GROUP_FIELDS)
    assert (await client.get("/status")).json()["queue_size"] == 3
    await client.get("/batch")  # serves cursor 1; still observable (retention window)
    rest = (await client.get("/observe", params={"after": 0, "env_id": env_id})).json()
    assert [g["cursor"] for g in rest["groups"]] == [2, 3] and rest["next_cursor"] == 3
    assert (await client.get("/observe", params={"after": 3})).json() == {"groups": [], "next_cursor": 3}
    assert len((await client.get("/observe")).json()["groups"]) == 3


async def test_observe_retention_is_bounded() -> None:
    app = make_app(observe_retention_groups=1, replay_batches=1)  # only the last batch kept
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await start_trainer(c, batch_size=1)
        for i in range(4):
            await c.post("/scored_data", json=make_group(1, seed=i))
        for _ in range(3):
            await c.get("/batch")
        cursors = [g["cursor"] for g in (await c.get("/observe")).json()["groups"]]
        assert cursors == [3, 4]  # one served group kept + the queued one


async def test_queue_limit_answers_429_and_keeps_queue() -> None:
    app = make_app(max_queued_groups=2, retry_after_s=3)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await start_trainer(c, batch_size=2)
        for i in range(2):
            assert (await c.post("/scored_data", json=make_group(2, seed=i))).status_code == 200
        full = await c.post("/scored_data", json=make_group(2, seed=9))
        assert full.status_code == 429 and full.headers["retry-after"] == "3"
        assert "--max-queued-groups" in full.json()["detail"]
        assert (await c.get("/status")).json()["queue_size"] == 2
        assert (await c.get("/batch")).json()["batch"][0]["tokens"] == make_group(2, seed=0)["tokens"]
        assert (await c.post("/scored_data", json=make_group(2, seed=9))).status_code == 200


async def test_token_limit_and_group_larger_than_queue() -> None:
    app = make_app(max_queued_tokens=20)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        assert (await c.post("/scored_data", json=make_group(2, length=8))).status_code == 200
        assert (await c.post("/scored_data", json=make_group(1, length=8))).status_code == 429
        huge = await c.post("/scored_data", json=make_group(3, length=8))
        assert huge.status_code == 413 and "--max-queued-tokens" in huge.json()["detail"]


async def test_auth_required_everywhere_but_root() -> None:
    app = make_app(api_key="s3cret")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        assert (await c.get("/")).status_code == 200
        for method, path in [("GET", "/info"), ("GET", "/batch"), ("POST", "/scored_data"),
                             ("GET", "/status"), ("GET", "/reset_data"), ("GET", "/observe"),
                             ("POST", "/register"), ("GET", "/status-env?env_id=0")]:
            response = await c.request(method, path)
            assert response.status_code == 401, path
            assert response.headers["www-authenticate"] == "Bearer"
        wrong = await c.get("/info", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = await c.get("/info", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        schema = (await c.get("/openapi.json")).json()
        assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


async def test_gzip_requests_and_small_responses(client: httpx.AsyncClient) -> None:
    body = orjson.dumps(make_group(2, length=400))
    for encoding in ("gzip", "GZIP", "x-gzip"):
        response = await client.post("/scored_data", content=gzip.compress(body),
                                     headers={**JSON, "Content-Encoding": encoding})
        assert response.json() == {"status": "received"}, encoding
    bad = await client.post("/scored_data", content=b"not gzip", headers=GZ)
    assert bad.status_code == 400 and bad.text == "Invalid gzip payload"
    truncated = await client.post("/scored_data", content=gzip.compress(body)[:-20],
                                  headers=GZ)
    assert truncated.status_code == 400 and truncated.text == "Invalid gzip payload"
    small = await client.get("/info", headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in small.headers
    big = await client.get("/latest_example", headers={"Accept-Encoding": "gzip"})
    assert big.headers["content-encoding"] == "gzip"


async def test_body_caps_answer_413() -> None:
    app = make_app(max_body_bytes=2000, max_decompressed_bytes=5000)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        big = orjson.dumps(make_group(2, length=400))
        response = await c.post("/scored_data", content=big, headers=JSON)
        assert response.status_code == 413 and "--max-body-bytes" in response.json()["detail"]
        bomb = gzip.compress(b'{"tokens": [[' + b"1," * 50_000 + b"1]]}")
        assert len(bomb) < 2000
        response = await c.post("/scored_data", content=bomb, headers=GZ)
        assert response.status_code == 413 and "--max-decompressed-bytes" in response.json()["detail"]


async def test_openapi_documents_every_endpoint(client: httpx.AsyncClient) -> None:
    schema = (await client.get("/openapi.json")).json()
    paths = schema["paths"]
    for path, method in [("/", "get"), ("/register", "post"), ("/register-env", "post"),
                         ("/disconnect-env", "post"), ("/wandb_info", "get"), ("/info", "get"),
                         ("/batch", "get"), ("/latest_example", "get"), ("/scored_data", "post"),
                         ("/scored_data_list", "post"), ("/status", "get"), ("/status-env", "get"),
                         ("/reset_data", "get"), ("/observe", "get")]:
        assert method in paths[path], path
        assert paths[path][method].get("description") or paths[path][method].get("summary")
    scored = schema["components"]["schemas"]["ScoredData"]
    assert set(GROUP_FIELDS) <= set(scored["properties"])
    assert all(p.get("description") for p in scored["properties"].values())
    assert "$ref" in str(paths["/scored_data"]["post"]["requestBody"])
    assert "ObserveResponse" in schema["components"]["schemas"]
    undocumented = [f"{name}.{prop}" for name, model in schema["components"]["schemas"].items()
                    if name not in ("HTTPValidationError", "ValidationError")  # FastAPI's own
                    for prop, spec in model.get("properties", {}).items()
                    if not spec.get("description")]
    assert undocumented == []


async def test_silent_env_stops_holding_its_minimum() -> None:
    import asyncio

    app = make_app(env_heartbeat_timeout_s=0.3)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await start_trainer(c, batch_size=2)
        a = await register_env(c, group_size=1, name="a")
        b = await register_env(c, group_size=1, name="b", min_batch_allocation=0.5)
        for i in range(2):
            await c.post("/scored_data", json=make_group(1, env_id=a, seed=i))
        assert (await c.get("/batch")).json() == {"batch": None}  # waiting for b
        for _ in range(3):  # a keeps polling; b stays silent past the heartbeat timeout
            await asyncio.sleep(0.15)
            await c.get("/status-env", params={"env_id": a})
        assert len((await c.get("/batch")).json()["batch"]) == 2
        # b speaks again: its minimum applies again
        await c.get("/status-env", params={"env_id": b})
        for i in range(2):
            await c.post("/scored_data", json=make_group(1, env_id=a, seed=5 + i))
        assert (await c.get("/batch")).json() == {"batch": None}


async def test_cors_is_off_by_default_and_never_allows_credentials() -> None:
    preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "GET"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=make_app()),
                                 base_url="http://api") as c:
        response = await c.get("/info", headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in response.headers
    app = make_app(cors_origins=["http://dash.local"], api_key="k")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        ok = await c.options("/info", headers={**preflight, "Origin": "http://dash.local"})
        assert ok.headers["access-control-allow-origin"] == "http://dash.local"
        assert "access-control-allow-credentials" not in ok.headers
        evil = await c.options("/info", headers=preflight)
        assert evil.headers.get("access-control-allow-origin") != "http://evil.example"


async def test_batch_reports_server_timing_and_step_in_status(client) -> None:
    await start_trainer(client, batch_size=2)
    await client.post("/scored_data", json=make_group(2))
    response = await client.get("/batch")
    assert response.headers["server-timing"].startswith("app;dur=")
    assert (await client.get("/status")).json() == {"current_step": 1, "queue_size": 0}


def test_package_exposes_the_uvicorn_app() -> None:
    import atroposlib.api as api_pkg
    from atroposlib.api import app, build_app

    assert app.title == "AtroposLib API"
    assert api_pkg.app is app and callable(build_app)
