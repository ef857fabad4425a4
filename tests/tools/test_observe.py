import threading
import time

import httpx
import pytest

from atroposlib.api.client import AtroposClient
from atroposlib.tools.observe import GroupObserver, RecentGroups
from tests.fixtures.api_server import start_run_api
from tests.tools.groups import register_trainer_and_envs


def group(tag: str, env_id=None):
    g = {"tokens": [[1, 2, 3], [1, 2, 4]], "masks": [[-100, 2, 3], [-100, 2, 4]], "scores": [1.0, 0.0],
         "messages": [[{"role": "user", "content": tag}, {"role": "assistant", "content": "a"}]] * 2}
    if env_id is not None:
        g["env_id"] = env_id
    return g


@pytest.fixture(scope="module")
def api():
    api = start_run_api()
    try:
        yield api
    finally:
        api.stop()


def test_observer_pages_through_everything_once_and_in_order(api):
    for i in range(7):
        httpx.post(api.url + "/scored_data", json=group(f"page-{i}")).raise_for_status()
    with AtroposClient(api.url) as client:
        obs = GroupObserver(client, page_size=3)
        seen = list(obs.follow(poll_interval=0.05, idle_timeout=0.3))
        tags = [g.group["messages"][0][0]["content"] for g in seen if
                g.group["messages"][0][0]["content"].startswith("page-")]
        assert tags == [f"page-{i}" for i in range(7)]
        cursors = [g.cursor for g in seen]
        assert cursors == sorted(set(cursors))
        # resuming after the last cursor gives nothing new; a new group shows up once
        assert obs.poll() == []
        httpx.post(api.url + "/scored_data", json=group("late")).raise_for_status()
        (late,) = obs.poll()
        assert late.group["messages"][0][0]["content"] == "late" and late.cursor > cursors[-1]
        assert GroupObserver(client, after=late.cursor).poll() == []


def test_follow_stops_on_event(api):
    with AtroposClient(api.url) as client:
        stop = threading.Event()
        obs = GroupObserver(client, after=10**9)
        threading.Timer(0.3, stop.set).start()
        t0 = time.monotonic()
        assert list(obs.follow(poll_interval=0.05, stop=stop)) == []
        assert time.monotonic() - t0 < 5


def test_recent_groups_filters_by_env_and_survives_api_errors():
    api = start_run_api()
    try:
        env_a, env_b = register_trainer_and_envs(api.url, 2)
        for env_id, tag in [(env_a, "a1"), (env_b, "b1"), (env_a, "a2")]:
            httpx.post(api.url + "/scored_data", json=group(tag, env_id)).raise_for_status()
        with AtroposClient(api.url, max_attempts=1) as client:
            feed = RecentGroups(GroupObserver(client, page_size=2), max_groups=2)
            assert feed.refresh() == 3 and feed.last_error is None
            # bounded window: the oldest fell out; newest first
            assert [g.group["messages"][0][0]["content"] for g in feed.snapshot()] == ["a2", "b1"]
            assert [g.group["messages"][0][0]["content"] for g in feed.snapshot(env_id=env_a)] == ["a2"]
            assert feed.env_ids() == sorted([env_a, env_b])
            api.stop()
            assert feed.refresh() == 0
            assert "ApiUnavailableError" in feed.last_error
    finally:
        api.stop()


def test_groups_that_leave_the_retention_window_are_counted_as_missed():
    # --replay-batches 1: the groups of the batches kept for replay would stay readable too
    api = start_run_api("--observe-retention-groups", "1", "--observe-retention-tokens", "1000000",
                        "--replay-batches", "1")
    try:
        register_trainer_and_envs(api.url, 0, batch_size=2)
        with AtroposClient(api.url) as client:
            obs = GroupObserver(client)
            client.post_scored_data(group("first"))
            assert [g.group["messages"][0][0]["content"] for g in obs.poll()] == ["first"]
            for i in range(4):  # served at once: only the newest served group stays readable
                client.post_scored_data(group(f"late-{i}"))
                assert client.get_batch() is not None
            tags = [g.group["messages"][0][0]["content"] for g in obs.poll()]
            assert 1 <= len(tags) < 4 and tags == [f"late-{i}" for i in range(4 - len(tags), 4)]
            assert obs.missed == 4 - len(tags)  # every group is either read or counted missed
            # starting fresh (no --after) is not a miss: the reader begins at the oldest kept
            fresh = GroupObserver(client)
            assert len(fresh.poll()) == len(tags) and fresh.missed == 0
    finally:
        api.stop()
