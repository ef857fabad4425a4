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
from tests.fixtures.lossy import LossyTransport

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
    registration = {**REGISTRATION, "batch_size": 2, "max_token_len": 1024}  # 600-token rows
    assert post(run_api, "/register", registration).status_code == 200
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


def test_kill_9_and_lost_replies_lose_no_group_and_store_or_serve_none_twice(tmp_path) -> None:
    """4 posters and a trainer through lossy connections; the server is killed -9 five times."""
    db = tmp_path / "queue.db"
    api = start_run_api(db=db)
    trainer_http = LossyTransport(0.2, seed=0)
    trainer = AtroposClient(api.url, max_attempts=10_000, max_retry_seconds=60, transport=trainer_http)
    trainer.register(Registration(**{**REGISTRATION, "batch_size": 2}))
    assert trainer.get_batch() is None
    env = post(api, "/register-env", {"max_token_length": 256, "desired_name": "e", "weight": 1,
                                      "group_size": 2}).json()["env_id"]
    assert post(api, "/scored_data", make_group(1, env_id=env, seed=10_000)).json()["status"] == "buffered"
    acked: list[int] = []
    served: list[int] = []
    stop_posting, stop_training = threading.Event(), threading.Event()
    poster_http = [LossyTransport(0.1, seed=p) for p in range(1, 5)]

    def poster(p: int) -> None:
        with AtroposClient(api.url, max_attempts=10_000, max_retry_seconds=60,
                           transport=poster_http[p]) as client:
            i = 0
            while not stop_posting.is_set():
                group = make_group(2, env_id=env, seed=i)
                group["tokens"][0][0] = gid = 1_000_000 * (p + 1) + i  # an id we can recognise
                client.post_scored_data(group)  # retried (same key) until stored
                acked.append(gid)
                i += 1

    def train() -> None:
        while not stop_training.is_set():
            batch = trainer.get_batch()
            served.extend(g["tokens"][0][0] for g in batch or [])
            if not batch:
                time.sleep(0.01)

    threads = [threading.Thread(target=poster, args=(p,)) for p in range(4)]
    threads.append(threading.Thread(target=train))
    for thread in threads:
        thread.start()
    kills = 0
    try:
        while kills < 5:
            goal_acked, goal_served = len(acked) + 15, len(served) + 4
            deadline = time.monotonic() + 30
            while (len(acked) < goal_acked or len(served) < goal_served) and time.monotonic() < deadline:
                time.sleep(0.02)
            api.kill()
            kills += 1
            time.sleep(0.1)
            api = start_run_api(db=db, port=api.port)
    finally:
        stop_posting.set()
        for thread in threads[:4]:
            thread.join(90)
        stop_training.set()
        threads[4].join(90)
    try:
        assert get(api, "/info").json()["batch_size"] == 2
        while (batch := trainer.get_batch()) is not None:  # drain
            served.extend(g["tokens"][0][0] for g in batch)
        lost = set(acked) - set(served)
        duplicated = len(served) - len(set(served))
        lost_post_replies = sum(t.lost_replies for t in poster_http)
        print(f"\ndurability: kills={kills} groups_acked={len(acked)} served={len(served)} "
              f"lost={len(lost)} duplicated={duplicated} lost_post_replies={lost_post_replies} "
              f"lost_batch_replies={trainer_http.lost_replies} "
              f"groups_in_lost_batch_replies={trainer_http.lost_groups}")
        assert kills == 5 and len(acked) >= 40
        assert trainer_http.lost_groups > 0 and lost_post_replies > 0  # the faults did happen
        assert not lost, f"{len(lost)} acknowledged groups were lost"
        assert duplicated == 0, f"{duplicated} groups were served twice"
        assert set(served) == set(acked), "a group was served that no poster sent"
        # one group per batch: every step the server counted reached the trainer
        assert get(api, "/status").json() == {"current_step": len(served), "queue_size": 0}
        # /observe survived: cursors are persisted and keep increasing after the restarts
        observed = get(api, "/observe", params={"after": 0, "limit": 1000}).json()
        cursors = [g["cursor"] for g in observed["groups"]]
        assert cursors == sorted(set(cursors)) and observed["next_cursor"] >= len(acked)
        # the registered env and its buffered partial group survived too
        merged = post(api, "/scored_data", make_group(1, env_id=env, seed=10_001))
        assert merged.json() == {"status": "buffered", "buffer_size": 0}
        assert get(api, "/status-env", params={"env_id": env}).status_code == 200
        after_restart = get(api, "/observe", params={"after": observed["next_cursor"]}).json()
        assert [g["cursor"] for g in after_restart["groups"]] == [observed["next_cursor"] + 1]
        [merged_group] = drain(api)
        assert merged_group["tokens"] == (make_group(1, seed=10_000)["tokens"]
                                          + make_group(1, seed=10_001)["tokens"])
    finally:
        trainer.close()
        assert api.stop() == 0


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
