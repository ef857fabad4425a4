"""The real ``run-api`` process (uvicorn on a free 127.0.0.1 port): transport-level behaviour,
signals and kill -9 durability with ``--db``."""

from __future__ import annotations

import gzip
import subprocess
import sys
import threading
import time

import httpx
import orjson
import pytest

from atroposlib.api.client import AtroposClient
from atroposlib.api.models import Registration
from tests.fixtures.api_server import RunApi, start_run_api

from .conftest import REGISTRATION, make_group


def post(api: RunApi, path: str, body, **kw) -> httpx.Response:
    return httpx.post(api.url + path, json=body, headers=api.headers, timeout=10, **kw)


def get(api: RunApi, path: str, **kw) -> httpx.Response:
    return httpx.get(api.url + path, headers={**api.headers, **kw.pop("headers", {})}, timeout=10, **kw)


def drain(api: RunApi) -> list[dict]:
    groups = []
    while (batch := get(api, "/batch").json()["batch"]) is not None:
        groups.extend(batch)
    return groups


def test_run_api_fixture_serves_and_stops_cleanly_on_sigterm(run_api: RunApi) -> None:
    assert get(run_api, "/").json() == {"message": "AtroposLib API"}
    assert run_api.stop() == 0
    assert "Traceback" not in run_api.log()


def test_sigint_exits_cleanly() -> None:
    api = start_run_api()
    api.proc.send_signal(2)
    assert api.proc.wait(15) == 0
    api.stop()


def test_gzip_over_the_wire_and_response_compression(run_api: RunApi) -> None:
    assert post(run_api, "/register", {**REGISTRATION, "batch_size": 2}).status_code == 200
    body = orjson.dumps(make_group(2, length=600))
    response = httpx.post(run_api.url + "/scored_data", content=gzip.compress(body),
                          headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert response.json() == {"status": "received"}
    bad = httpx.post(run_api.url + "/scored_data", content=gzip.compress(body)[:100],
                     headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert (bad.status_code, bad.text) == (400, "Invalid gzip payload")
    info = httpx.get(run_api.url + "/info", headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in info.headers  # < 1000 bytes: never compressed
    latest = httpx.get(run_api.url + "/latest_example", headers={"Accept-Encoding": "gzip"})
    assert latest.headers["content-encoding"] == "gzip"
    assert latest.json()["tokens"] == make_group(2, length=600)["tokens"]
    batch = httpx.get(run_api.url + "/batch", headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in batch.headers  # /batch hot path is not compressed
    assert float(batch.headers["server-timing"].split("dur=")[1]) >= 0
    assert batch.json()["batch"][0]["tokens"] == make_group(2, length=600)["tokens"]


def test_auth_caps_and_backpressure_over_http() -> None:
    api = start_run_api("--api-key", "k3y", "--max-queued-groups", "2", "--max-body-bytes", "4000")
    try:
        assert httpx.get(api.url + "/").status_code == 200
        assert httpx.get(api.url + "/status").status_code == 401
        assert get(api, "/status").status_code == 200
        assert post(api, "/scored_data", make_group(1)).json() == {"status": "received"}
        assert post(api, "/scored_data", make_group(1, seed=1)).json() == {"status": "received"}
        full = post(api, "/scored_data", make_group(1, seed=2))
        assert full.status_code == 429 and full.headers["retry-after"] == "1"
        assert get(api, "/status").json()["queue_size"] == 2
        big = post(api, "/scored_data", make_group(2, length=500))
        assert big.status_code == 413
        chunked = httpx.post(api.url + "/scored_data",
                             headers={**api.headers, "Content-Type": "application/json"},
                             content=iter([orjson.dumps(make_group(2, length=500))]))
        assert chunked.status_code == 413
        with AtroposClient(api.url, api_key="k3y") as client:
            client.register(Registration(**REGISTRATION))
            assert client.status()["queue_size"] == 2
            assert client.observe(after=0, limit=1)["next_cursor"] == 1
    finally:
        assert api.stop() == 0


def test_kill_9_loses_no_acked_group_and_serves_none_twice(tmp_path) -> None:
    db = tmp_path / "queue.db"
    api = start_run_api(db=db)
    assert post(api, "/register", {**REGISTRATION, "batch_size": 2}).status_code == 200
    assert get(api, "/batch").json() == {"batch": None}
    env = post(api, "/register-env", {"max_token_length": 256, "desired_name": "e", "weight": 1,
                                      "group_size": 2}).json()["env_id"]
    assert post(api, "/scored_data", make_group(1, env_id=env, seed=10_000)).json()["status"] == "buffered"
    acked: list[int] = []
    stop = threading.Event()

    def poster() -> None:
        client = httpx.Client(base_url=api.url, timeout=5)
        i = 0
        while not stop.is_set():
            group = make_group(2, env_id=env, seed=i)
            group["tokens"][0][0] = i  # an id we can recognise
            try:
                if client.post("/scored_data", json=group).status_code == 200:
                    acked.append(i)
            except httpx.HTTPError:
                return
            i += 1

    thread = threading.Thread(target=poster)
    thread.start()
    served_before: list[int] = []
    deadline = time.monotonic() + 30
    while len(acked) < 40 and time.monotonic() < deadline:
        batch = get(api, "/batch").json()["batch"]
        served_before += [g["tokens"][0][0] for g in batch or []]
        time.sleep(0.01)
    api.kill()
    stop.set()
    thread.join(10)
    assert len(acked) >= 40 and served_before

    again = start_run_api(db=db)
    try:
        assert get(again, "/info").json()["batch_size"] == 2
        assert get(again, "/status").json()["current_step"] == len(served_before)
        served_after = [g["tokens"][0][0] for g in drain(again)]
        everything = served_before + served_after
        assert len(everything) == len(set(everything)), "a group was served twice"
        assert set(acked) <= set(everything), "an acknowledged group was lost"
        # /observe survived: cursors are persisted and keep increasing after the restart
        observed = get(again, "/observe", params={"after": 0, "limit": 1000}).json()
        cursors = [g["cursor"] for g in observed["groups"]]
        assert cursors == sorted(set(cursors)) and observed["next_cursor"] >= len(acked)
        # the registered env and its buffered partial group survived too
        merged = post(again, "/scored_data", make_group(1, env_id=env, seed=10_001))
        assert merged.json() == {"status": "buffered", "buffer_size": 0}
        assert get(again, "/status-env", params={"env_id": env}).status_code == 200
        after_restart = get(again, "/observe", params={"after": observed["next_cursor"]}).json()
        assert [g["cursor"] for g in after_restart["groups"]] == [observed["next_cursor"] + 1]
        [merged_group] = drain(again)
        assert merged_group["tokens"] == (make_group(1, seed=10_000)["tokens"]
                                          + make_group(1, seed=10_001)["tokens"])
    finally:
        assert again.stop() == 0


def test_help_is_fast_and_mentions_safer_default_host() -> None:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "atroposlib.cli.run_api", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert time.perf_counter() - start < 10
    assert "127.0.0.1" in out and "0.0.0.0" in out and "--db" in out and "--api-key" in out


def test_bad_flag_values_are_explained() -> None:
    result = subprocess.run([sys.executable, "-m", "atroposlib.cli.run_api", "--port", "99999"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "--port" in result.stderr


@pytest.mark.parametrize("flag", ["--reload"])
def test_reload_mode_starts(flag: str, tmp_path) -> None:
    api = start_run_api(flag, "--db", str(tmp_path / "r.db"))
    try:
        assert post(api, "/scored_data", make_group(1)).json() == {"status": "received"}
        assert get(api, "/status").json()["queue_size"] == 1
    finally:
        api.stop()


def test_second_server_on_same_db_is_refused(tmp_path) -> None:
    db = tmp_path / "one.db"
    api = start_run_api(db=db)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "atroposlib.cli.run_api", "--port", "0", "--db", str(db)],
            capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        assert "another run-api" in result.stderr
        assert get(api, "/status").status_code == 200
    finally:
        api.stop()


def test_api_key_from_environment() -> None:
    api = start_run_api(env={"ATROPOS_API_KEY": "from-env"})
    try:
        assert httpx.get(api.url + "/info").status_code == 401
        assert get(api, "/info").status_code == 200  # the fixture sends the env's key
        assert httpx.get(api.url + "/").status_code == 200
    finally:
        api.stop()


def test_sync_client_covers_the_env_endpoints(run_api: RunApi) -> None:
    from atroposlib.api.models import RegisterEnv

    with AtroposClient(run_api.url) as client:
        client.register(Registration(**{**REGISTRATION, "batch_size": 2}))
        assert client.get_batch() is None
        env = client.register_env(RegisterEnv(max_token_length=64, desired_name="e", weight=1,
                                              group_size=2))["env_id"]
        assert client.wandb_info() == {"group": "grp", "project": "proj"}
        reply = client.post_scored_data_list([make_group(2, env_id=env), make_group(1, env_id=env)])
        assert reply == {"status": "received", "groups_processed": 2, "buffered": 1,
                         "last_buffer_size": 1}
        assert client.status_env(env)["self_queue_size"] == 1
        assert len(client.get_batch()) == 1
        assert client.disconnect_env(env) == {"status": "success"}
        client.reset_data()
        assert client.info() == {"batch_size": -1, "max_token_len": -1}
