"""The run ledger: run-api's journal of rollouts and completion tokens closes exactly."""

from __future__ import annotations

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atroposlib.api.ledger import completion_tokens, group_entry
from atroposlib.api.models import RegisterEnv, Registration, ScoredData
from atroposlib.api.settings import ApiSettings
from atroposlib.api.state import ApiState
from tests.fixtures.api_server import start_run_api

from .conftest import REGISTRATION, make_app, make_group, register_env, start_trainer

#: completion tokens of each sequence of make_group's default length (5 tokens, prompt of 2)
PER_SEQ = 3


def _closes(ledger: dict) -> bool:
    r, t = ledger["rollouts"], ledger["tokens"]
    rollouts = r["sampled"] == r["completed"] + r["masked"] + r["failed"]
    tokens = t["sampled"] == (t["served"] + t["dropped_stale"] + t["dropped_filter"]
                              + t["dropped_masked"] + t["queued"])
    return rollouts and tokens and ledger["closes"]


def _with_outcomes(group: dict, prefix: str, *, masked_len: int | None = 4,
                   failed_attempt: int = 1, kept_attempts: list[int] | None = None) -> dict:
    """``group`` plus one masked member (with a sequence of ``masked_len`` tokens, 2 trained)
    and one failed member, ``failed_attempt`` retries deep."""
    n = len(group["tokens"])
    masked = {"rollout_id": f"{prefix}/m", "outcome": "masked", "reason": "truncated",
              "score": 0.0}
    if masked_len is not None:
        masked |= {"tokens": list(range(10, 10 + masked_len)),
                   "masks": [-100, -100] + list(range(12, 10 + masked_len))}
    failed = {"rollout_id": f"{prefix}/f", "attempt": failed_attempt, "outcome": "failed",
              "kind": "timeout"}
    return {**group, "rollout_ids": [f"{prefix}/{i}" for i in range(n)],
            "attempts": kept_attempts or [0] * n, "excluded": [masked, failed]}


def test_completion_tokens_count_labels_that_are_not_ignored() -> None:
    assert completion_tokens([[-100, -100, 5, 6], [-100, 7]]) == 3
    assert completion_tokens(None) == 0


def test_a_group_entry_counts_every_attempt_of_every_member() -> None:
    group = ScoredData(**_with_outcomes(make_group(2), "g", failed_attempt=2,
                                        kept_attempts=[1, 0]))
    entry = group_entry(group, env_id=None)
    # kept: 2 completed + 1 retry; masked: 1; failed: 2 retries + its last attempt
    assert (entry.completed, entry.masked, entry.failed) == (2, 1, 4)
    assert entry.masked_tokens == 2 and entry.sampled == 2 * PER_SEQ + 2


async def test_excluded_members_stale_drops_and_env_drops_close_the_identity() -> None:
    app = make_app(max_staleness=1)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await start_trainer(c, starting_step=5)
        env = await register_env(c, group_size=4)
        drops = {"groups": 3, "completed": 12, "failed": 1, "tokens": 30, "masked_tokens": 2,
                 "masked": 1, "groups_by_reason": {"same_scores": 2, "too_long": 1},
                 "tokens_by_reason": {"same_scores": 20, "too_long": 10}}
        posts = [
            _with_outcomes(make_group(2, env_id=env, seed=1, policy_version=5), "a"),
            make_group(4, env_id=env, seed=2, policy_version=2),  # stale at the next batch
            _with_outcomes(make_group(2, env_id=env, seed=3, policy_version=5), "b",
                           masked_len=None) | {"env_drops": drops},
            make_group(4, env_id=env, seed=4, policy_version=5),  # queued at the end
        ]
        for group in posts:
            assert (await c.post("/scored_data", json=group)).status_code == 200
        assert (await c.get("/status")).json() == {  # the answer without ?ledger is as before
            "current_step": 5, "queue_size": 4, "max_staleness": 1, "stale_groups_dropped": {}}
        batch = (await c.get("/batch")).json()["batch"]
        assert len(batch) == 2 and all("env_drops" not in g for g in batch)
        ledger = (await c.get("/status", params={"ledger": "true"})).json()["ledger"]
        assert ledger == (await c.get("/ledger")).json()
    assert _closes(ledger)
    assert ledger["rollouts"] == {"sampled": 12 + 2 + 3 + 1 + 12 + 1 + 1,
                                  "completed": 2 + 4 + 2 + 4 + 12, "masked": 2 + 1,
                                  "failed": 2 + 2 + 1}
    assert ledger["tokens"] == {
        "sampled": 12 * PER_SEQ + 2 + 30 + 2, "served": 4 * PER_SEQ, "dropped_stale": 4 * PER_SEQ,
        "dropped_filter": 30, "dropped_masked": 2 + 2, "queued": 4 * PER_SEQ}
    assert ledger["groups"] == {"accepted": 4, "dropped_by_env": 3, "dropped_stale": 1,
                                "batches_served": 1}
    assert ledger["dropped_filter_by_reason"] == {"same_scores": {"groups": 2, "tokens": 20},
                                                  "too_long": {"groups": 1, "tokens": 10}}


async def test_partial_groups_count_once_whether_buffered_merged_or_served() -> None:
    app = make_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await start_trainer(c, batch_size=8)
        env = await register_env(c, group_size=4)
        for seed in range(3):  # 2 + 2 merge into one group of 4; the third waits in the buffer
            await c.post("/scored_data", json=make_group(2, env_id=env, seed=seed))
        first = (await c.get("/ledger")).json()
        await c.post("/scored_data", json=make_group(4, env_id=env, seed=9))
        assert (await c.get("/batch")).json()["batch"] is not None
        ledger = (await c.get("/ledger", params={"entries": 10})).json()
    assert _closes(first) and first["tokens"]["queued"] == 6 * PER_SEQ
    assert _closes(ledger) and ledger["tokens"]["served"] == 8 * PER_SEQ
    assert ledger["tokens"]["queued"] == 2 * PER_SEQ
    assert [e["kind"] for e in ledger["entries"]] == ["group"] * 4 + ["served"]
    assert [e["seq"] for e in ledger["entries"]] == [1, 2, 3, 4, 5]


async def test_a_refused_group_leaves_no_trace_in_the_ledger() -> None:
    app = make_app(max_queued_groups=1)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        await start_trainer(c)
        await c.post("/scored_data", json=make_group(2, seed=1))
        before = (await c.get("/ledger")).json()
        refused = await c.post("/scored_data", json=make_group(2, seed=2) | {
            "env_drops": {"groups": 1, "tokens": 5}})
        assert refused.status_code == 429
        assert (await c.get("/ledger")).json() == before
        bad = await c.post("/scored_data", json=make_group(2, seed=2) | {
            "env_drops": {"groups": 1, "tokens": 5, "tokens_by_reason": {"same_scores": 4}}})
        assert bad.status_code == 422 and "tokens_by_reason sums to 4" in bad.text


# ---------------------------------------------------------------------- property test
_member = st.fixed_dictionaries({"outcome": st.sampled_from(["masked", "failed"]),
                                 "attempt": st.integers(0, 3), "with_seq": st.booleans()})
_group = st.fixed_dictionaries({
    "n": st.integers(1, 4), "excluded": st.lists(_member, max_size=2),
    "attempts": st.lists(st.integers(0, 2), min_size=4, max_size=4),
    "version": st.one_of(st.none(), st.integers(0, 6)),
    "drops": st.one_of(st.none(), st.tuples(st.integers(1, 3), st.integers(0, 40))),
})
_ops = st.lists(st.one_of(st.tuples(st.just("post"), _group), st.tuples(st.just("batch"), st.none()),
                          st.tuples(st.just("reregister"), st.integers(0, 2))), max_size=25)


def _scored(spec: dict, env_id: int, seed: int) -> ScoredData:
    group = make_group(spec["n"], env_id=env_id, seed=seed)
    if spec["excluded"][:4 - spec["n"]]:
        excluded = []
        for i, m in enumerate(spec["excluded"][:4 - spec["n"]]):  # at most group_size members
            entry = {"rollout_id": f"{seed}/x{i}", "attempt": m["attempt"], "outcome": m["outcome"]}
            if m["outcome"] == "failed":
                entry["kind"] = "inference"
            else:
                entry |= {"reason": "format"} | ({"tokens": [1, 2, 3], "masks": [-100, 2, 3]}
                                                 if m["with_seq"] else {})
            excluded.append(entry)
        group |= {"rollout_ids": [f"{seed}/{i}" for i in range(spec["n"])],
                  "attempts": spec["attempts"][:spec["n"]], "excluded": excluded}
    if spec["version"] is not None:
        group["policy_version"] = spec["version"]
    if spec["drops"] is not None:
        group["env_drops"] = {"groups": spec["drops"][0], "tokens": spec["drops"][1],
                              "completed": 4 * spec["drops"][0]}
    return ScoredData(**group)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ops)
def test_the_identity_closes_after_any_sequence_of_posts_batches_and_stale_drops(ops) -> None:
    state = ApiState(ApiSettings())
    state.register(Registration(**REGISTRATION, max_staleness=1))
    state.next_batch()
    env = state.register_env(RegisterEnv(max_token_length=256, desired_name="e", weight=1.0,
                                         group_size=4))["env_id"]
    expected_sampled = 0
    for seed, (op, arg) in enumerate(ops):
        if op == "post":
            group = _scored(arg, env, seed)
            state.ingest([group])
            entry = group_entry(group, env)
            expected_sampled += entry.completed + entry.masked + entry.failed
            if group.env_drops is not None:
                expected_sampled += group.env_drops.completed
        elif op == "batch":
            state.next_batch()
        else:  # a trainer re-registering with another staleness limit
            state.register(Registration(**REGISTRATION, max_staleness=arg))
        ledger = state.ledger()
        assert _closes(ledger), ledger
        assert ledger["rollouts"]["sampled"] == expected_sampled
        queued = sum(g.ledger_tokens for g in state.queue.values()) + sum(
            p.ledger_tokens for parts in state.partials.values() for p in parts)
        assert ledger["tokens"]["queued"] == queued


# ---------------------------------------------------------------------- kill -9
def test_the_identity_closes_after_kill_9_of_a_real_run_api(tmp_path) -> None:
    db = tmp_path / "q.db"
    api = start_run_api("--max-staleness", "0", db=db)
    try:
        httpx.post(api.url + "/register", json={**REGISTRATION, "batch_size": 4}).raise_for_status()
        httpx.get(api.url + "/batch")
        env = httpx.post(api.url + "/register-env", json={
            "max_token_length": 256, "desired_name": "e", "weight": 1.0, "group_size": 2}).json()["env_id"]
        posts = [_with_outcomes(make_group(1, env_id=env, seed=0), "a", failed_attempt=0)
                 | {"group_overrides": {"group_size": 3}},  # never stale: no policy_version
                 make_group(2, env_id=env, seed=1, policy_version=0),
                 make_group(2, env_id=env, seed=2, policy_version=0,
                            env_drops={"groups": 1, "completed": 2, "tokens": 6}),
                 make_group(1, env_id=env, seed=3)]  # a partial group: buffered
        for group in posts:
            httpx.post(api.url + "/scored_data", json=group).raise_for_status()
        assert httpx.get(api.url + "/batch").json()["batch"] is not None  # step 1
        httpx.post(api.url + "/scored_data",  # stale at the next poll (policy 0, step 1)
                   json=make_group(2, env_id=env, seed=4, policy_version=0)).raise_for_status()
        assert httpx.get(api.url + "/batch").json()["batch"] is None
        before = httpx.get(api.url + "/ledger").json()
        api.kill()
        api = start_run_api(db=db, port=api.port)
        after = httpx.get(api.url + "/ledger", params={"entries": 100}).json()
        # it goes on counting where it stopped: [1, 2] queued, the second 1 merges with the
        # buffered one, and a batch of 2 + 2 is served
        for group in (make_group(2, env_id=env, seed=5), make_group(1, env_id=env, seed=6)):
            httpx.post(api.url + "/scored_data", json=group).raise_for_status()
        assert httpx.get(api.url + "/batch").json()["batch"] is not None
        later = httpx.get(api.url + "/ledger").json()
        metrics = httpx.get(api.url + "/metrics").text
    finally:
        api.stop()
    assert _closes(before) and before["tokens"]["dropped_stale"] == 2 * PER_SEQ
    assert before["tokens"]["served"] == 4 * PER_SEQ and before["tokens"]["queued"] == 2 * PER_SEQ
    assert {k: v for k, v in after.items() if k != "entries"} == before
    assert [e["kind"] for e in after["entries"]] == [
        "group", "group", "group", "env_drops", "group", "served", "group", "stale"]
    assert _closes(later) and later["tokens"]["served"] == before["tokens"]["served"] + 4 * PER_SEQ
    assert f'atropos_api_ledger_tokens_total{{fate="sampled"}} {later["tokens"]["sampled"]}.0' in metrics
    assert "Traceback" not in api.log()
