"""Rollout outcomes on the wire: rollout_ids / attempts / excluded, validated and served back.

Stock groups (no outcome fields) are served with exactly their 14 keys, as before; groups with
outcome fields get them back in ``/batch``, through a restart with ``--db`` too, and a group
that lists its excluded members is queued as it is (never buffered as a partial group).
"""

from __future__ import annotations

import httpx
import pytest

from atroposlib.api.models import GROUP_FIELDS, OUTCOME_FIELDS, ExcludedMember, ScoredData
from tests.fixtures.api_server import RunApi, start_run_api

from .conftest import REGISTRATION, make_app, make_group, register_env, start_trainer

FAILED = {"rollout_id": "g1/2", "attempt": 1, "outcome": "failed", "kind": "timeout",
          "message": "rollout ran past 300 s"}
MASKED = {"rollout_id": "g1/3", "outcome": "masked", "reason": "truncated", "score": 0.25,
          "tokens": [5, 6, 7], "masks": [-100, 6, 7]}


def outcome_group(env_id: int | None = None, seed: int = 0) -> dict:
    """A group of 4 rollouts: 2 completed (kept), one failed, one masked."""
    return make_group(2, env_id=env_id, seed=seed, rollout_ids=["g1/0", "g1/1"], attempts=[0, 0],
                      excluded=[FAILED, MASKED])


def test_outcome_fields_validate_and_default_to_none() -> None:
    group = ScoredData(**outcome_group())
    assert group.rollout_ids == ["g1/0", "g1/1"]
    assert [m.outcome for m in group.excluded] == ["failed", "masked"]
    stock = ScoredData(**make_group(2))
    assert (stock.rollout_ids, stock.attempts, stock.excluded) == (None, None, None)
    assert set(OUTCOME_FIELDS).isdisjoint(GROUP_FIELDS) and len(GROUP_FIELDS) == 14


@pytest.mark.parametrize(("change", "words"), [
    ({"rollout_ids": ["a"]}, "rollout_ids has 1 entries but tokens has 2"),
    ({"attempts": [0, 0, 0]}, "attempts has 3 entries but tokens has 2"),
    ({"attempts": [0, -1]}, "whole number"),
    ({"rollout_ids": ["a", "a"]}, "appears twice"),
    ({"rollout_ids": ["a", "b"], "excluded": [{**FAILED, "rollout_id": "b"}]}, "appears twice"),
    ({"rollout_ids": ["", "b"]}, "at least 1 character"),
    ({"excluded": [{**FAILED, "score": 0.0}]}, "a failed member has no score"),
    ({"excluded": [{**FAILED, "kind": None}]}, "failed but has no kind"),
    ({"excluded": [{**FAILED, "kind": "oom"}]}, "'inference', 'timeout', 'env_error' or 'sandbox'"),
    ({"excluded": [{**FAILED, "tokens": [1], "masks": [1]}]}, "only masked members keep"),
    ({"excluded": [{**MASKED, "reason": None}]}, "masked but has no reason"),
    ({"excluded": [{**MASKED, "kind": "timeout"}]}, "kind is for failed members only"),
    ({"excluded": [{**MASKED, "masks": [1]}]}, "masks has 1 entries but tokens has 3"),
    ({"excluded": [{**MASKED, "masks": None}]}, "tokens and masks together"),
    ({"excluded": [{**MASKED, "outcome": "completed"}]}, "'masked' or 'failed'"),
])
async def test_bad_outcome_fields_get_a_clear_422(client: httpx.AsyncClient, change: dict,
                                                   words: str) -> None:
    response = await client.post("/scored_data", json={**outcome_group(), **change})
    assert response.status_code == 422, response.text
    assert words in response.text


async def test_outcome_group_is_queued_whole_and_served_with_its_outcomes() -> None:
    app = make_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await start_trainer(c, batch_size=6)
        env = await register_env(c, group_size=4)
        # 2 kept of 4: queued as it is, not buffered waiting for 2 more sequences
        assert (await c.post("/scored_data", json=outcome_group(env))).json() == {
            "status": "received"}
        for seed in (1, 2):  # stock partials of 2 are buffered and merged into a group of 4
            part = make_group(2, env_id=env, seed=seed)
            assert (await c.post("/scored_data", json=part)).json()["status"] == "buffered"
        served = (await c.get("/batch")).json()["batch"]
        assert [len(g["tokens"]) for g in served] == [2, 4]
        with_outcomes = [g for g in served if "excluded" in g]
        stock_groups = [g for g in served if "excluded" not in g]
        assert len(with_outcomes) == 1 and len(stock_groups) == 1
        assert list(stock_groups[0]) == list(GROUP_FIELDS)  # a stock group: its 14 keys only
        got = with_outcomes[0]
        assert list(got) == [*GROUP_FIELDS, *OUTCOME_FIELDS]
        assert got["rollout_ids"] == ["g1/0", "g1/1"] and got["attempts"] == [0, 0]
        assert got["excluded"] == [
            ExcludedMember(**FAILED).model_dump(exclude_none=True),
            ExcludedMember(**MASKED).model_dump(exclude_none=True)]
        assert got["excluded"][1]["tokens"] == [5, 6, 7] and "score" not in got["excluded"][0]
        assert got["scores"] == outcome_group(env)["scores"]  # the failed member has no score


async def test_kept_plus_excluded_beyond_group_size_is_refused() -> None:
    app = make_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await start_trainer(c, batch_size=4)
        env = await register_env(c, group_size=3)
        response = await c.post("/scored_data", json=outcome_group(env))
        assert response.status_code == 422
        assert "2 kept and 2 excluded members" in response.text


async def test_partials_with_rollout_ids_merge_their_ids() -> None:
    app = make_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await start_trainer(c, batch_size=4)
        env = await register_env(c, group_size=4)
        for k in range(2):
            part = make_group(2, env_id=env, seed=k, rollout_ids=[f"r{2 * k}", f"r{2 * k + 1}"],
                              attempts=[0, k])
            assert (await c.post("/scored_data", json=part)).json()["status"] == "buffered"
        batch = (await c.get("/batch")).json()["batch"]
        assert [g["rollout_ids"] for g in batch] == [["r0", "r1", "r2", "r3"]]
        assert batch[0]["attempts"] == [0, 0, 0, 1] and "excluded" not in batch[0]


def _post(api: RunApi, path: str, body: dict) -> httpx.Response:
    return httpx.post(api.url + path, json=body, headers=api.headers, timeout=10)


def test_outcomes_survive_a_restart_with_db_over_http(tmp_path) -> None:
    """A real run-api (uvicorn on 127.0.0.1) with --db: queued outcomes outlive the process."""
    db = tmp_path / "queue.db"
    api = start_run_api(db=db)
    try:
        assert _post(api, "/register", {**REGISTRATION, "batch_size": 4}).status_code == 200
        httpx.get(api.url + "/batch", headers=api.headers, timeout=10)
        env = _post(api, "/register-env", {"max_token_length": 256, "desired_name": "e",
                                           "weight": 1, "group_size": 4}).json()["env_id"]
        assert _post(api, "/scored_data", outcome_group(env)).json() == {"status": "received"}
        assert _post(api, "/scored_data", outcome_group(env, seed=1)).json() == {
            "status": "received"}
        bad = _post(api, "/scored_data", {**outcome_group(env), "excluded": [{"outcome": "x"}]})
        assert bad.status_code == 422
    finally:
        assert api.stop() == 0
    api = start_run_api(db=db)
    try:
        batch = httpx.get(api.url + "/batch", headers=api.headers, timeout=10).json()["batch"]
        assert len(batch) == 2
        assert batch[0]["rollout_ids"] == ["g1/0", "g1/1"]
        assert [m["kind"] if m["outcome"] == "failed" else m["reason"]
                for m in batch[0]["excluded"]] == ["timeout", "truncated"]
    finally:
        api.stop()
    assert "Traceback" not in api.log()
