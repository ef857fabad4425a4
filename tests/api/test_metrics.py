"""Prometheus metrics: run-api's ``GET /metrics`` parses and its counters move under load; the
shared conventions (names, a metrics endpoint for processes without an HTTP server) work."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from atroposlib.utils.prometheus import metric_name, serve_metrics
from tests.fixtures.api_server import RunApi

from .conftest import REGISTRATION, make_app, make_group, start_trainer

DOCS = Path(__file__).resolve().parents[2] / "docs"


def scrape(text: str) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of a Prometheus text page."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: dict, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and set(labels.items()) <= set(ls))


def test_run_api_metrics_parse_and_move_under_load(run_api: RunApi) -> None:
    url = run_api.url
    before = scrape(httpx.get(url + "/metrics").text)
    assert value(before, "atropos_api_queue_groups") == 0
    registration = {**REGISTRATION, "batch_size": 4, "vocab_size": 50_000,
                    "save_checkpoint_interval": 2}
    assert httpx.post(url + "/register", json=registration).status_code == 200
    httpx.get(url + "/batch")
    env = httpx.post(url + "/register-env", json={"max_token_length": 256, "desired_name": "m",
                                                  "weight": 1.0, "group_size": 2}).json()["env_id"]
    for seed in range(10):  # 10 good groups, 1 as a list of 2
        group = make_group(2, env_id=env, seed=seed, policy_version=0)
        assert httpx.post(url + "/scored_data", json=group).status_code == 200
    assert httpx.post(url + "/scored_data_list",
                      json=[make_group(2, seed=20), make_group(2, seed=21)]).status_code == 200
    bad = make_group(2, env_id=env, seed=30)
    bad["tokens"][0][3] = bad["masks"][0][3] = 60_000  # past the vocabulary
    for _ in range(3):
        assert httpx.post(url + "/scored_data", json=bad).status_code == 422
    assert httpx.post(url + "/scored_data", json={"tokens": "no"}).status_code == 422
    assert httpx.post(url + "/scored_data_list", json=[make_group(2), bad]).status_code == 422
    served = [httpx.get(url + "/batch") for _ in range(3)]
    assert [r.headers["x-atropos-step"] for r in served] == ["1", "2", "3"]
    assert httpx.get(url + "/batch", params={"step": 2}).content == served[1].content

    page = httpx.get(url + "/metrics")
    assert page.headers["content-type"].startswith("text/plain")
    after = scrape(page.text)
    assert value(after, "atropos_api_groups_accepted_total", env="m_0") == 10
    assert value(after, "atropos_api_groups_accepted_total", env="none") == 2
    assert value(after, "atropos_api_groups_refused_total", reason="vocab") == 3 + 2  # the list
    assert value(after, "atropos_api_groups_refused_total", reason="malformed") == 1
    assert value(after, "atropos_api_batches_served_total", replayed="false") == 3
    assert value(after, "atropos_api_batches_served_total", replayed="true") == 1
    assert value(after, "atropos_api_served_tokens_total") == 6 * 2 * 5
    assert value(after, "atropos_api_queue_groups") == 12 - 6
    assert value(after, "atropos_api_queue_tokens") == (12 - 6) * 2 * 5
    assert value(after, "atropos_api_step") == 3
    assert value(after, "atropos_api_replay_batches") == 3  # interval 2 + 2 = 4 kept at most
    assert value(after, "atropos_api_envs_active") == 1
    # staleness: served at steps 1, 2, 3 from policy version 0 (the env-less groups have none)
    assert value(after, "atropos_api_served_staleness_steps_count") == 6
    assert value(after, "atropos_api_served_staleness_steps_sum") == 2 * 1 + 2 * 2 + 2 * 3
    assert value(after, "atropos_api_queue_max_staleness_steps") == 3
    assert total(after, "atropos_api_request_duration_seconds_count", method="POST",
                 route="/scored_data", status="200") == 10
    assert total(after, "atropos_api_request_duration_seconds_count", route="/batch") >= 5
    httpx.get(url + "/no/such/path")
    unknown = scrape(httpx.get(url + "/metrics").text)
    assert total(unknown, "atropos_api_request_duration_seconds_count", route="other") == 1


async def test_metrics_route_needs_the_api_key_and_each_app_counts_alone() -> None:
    app = make_app(api_key="k3y")
    other = make_app()
    async with (httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c,
                httpx.AsyncClient(transport=httpx.ASGITransport(app=other),
                                  base_url="http://api") as o):
        assert (await c.get("/metrics")).status_code == 401
        c.headers["Authorization"] = "Bearer k3y"
        await start_trainer(c)
        await c.post("/scored_data", json=make_group(2))
        mine = scrape((await c.get("/metrics")).text)
        assert value(mine, "atropos_api_groups_accepted_total", env="none") == 1
        theirs = scrape((await o.get("/metrics")).text)
        assert value(theirs, "atropos_api_groups_accepted_total", env="none") == 0
        schema = (await c.get("/openapi.json")).json()
        assert "401" in schema["paths"]["/metrics"]["get"]["responses"]


def test_serve_metrics_exposes_a_registry_on_loopback() -> None:
    registry = CollectorRegistry()
    steps = Counter(metric_name("trainer", "steps"), "Optimizer steps.", registry=registry)
    server = serve_metrics(0, registry=registry)
    try:
        assert server.url.startswith("http://127.0.0.1:") and server.url.endswith("/metrics")
        assert value(scrape(httpx.get(server.url).text), "atropos_trainer_steps_total") == 0
        steps.inc(3)
        assert value(scrape(httpx.get(server.url).text), "atropos_trainer_steps_total") == 3
    finally:
        server.close()
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url, timeout=2)


def test_metric_names_follow_the_convention() -> None:
    assert metric_name("api", "queue_tokens") == "atropos_api_queue_tokens"
    with pytest.raises(ValueError, match="unknown metrics part"):
        metric_name("apii", "x")
    for bad in ("QueueTokens", "steps_total", "9x"):
        with pytest.raises(ValueError, match="snake case"):
            metric_name("trainer", bad)



async def test_dashboard_and_docs_name_exactly_the_metrics_run_api_exports(client) -> None:
    """docs/metrics.md lists every run-api metric, and the Grafana dashboard uses no other."""
    page = (await client.get("/metrics")).text
    exported = {f.name + "_total" if f.type == "counter" else f.name
                for f in text_string_to_metric_families(page)
                if f.name.startswith("atropos_api_") and not f.name.endswith("_created")}
    documented = set(re.findall(r"`(atropos_api_\w+)`", (DOCS / "metrics.md").read_text()))
    assert documented == exported
    dashboard = json.loads((DOCS / "grafana" / "atropos.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    used = {re.sub(r"_(bucket|sum|count)$", "", name)
            for expr in exprs for name in re.findall(r"atropos_api_\w+", expr)}
    assert len(used) >= 10 and used <= exported, used - exported
