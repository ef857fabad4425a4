"""SQLite store: state survives reopening; incompatible or busy files are refused clearly."""

from __future__ import annotations

import sqlite3

import pytest

from atroposlib.api.models import RegisterEnv, Registration, ScoredData
from atroposlib.api.settings import ApiSettings
from atroposlib.api.state import ApiState

from .conftest import REGISTRATION, make_group


def test_state_round_trips_through_sqlite(tmp_path) -> None:
    settings = ApiSettings(db=tmp_path / "q.db")
    state = ApiState(settings)
    state.register(Registration(**{**REGISTRATION, "batch_size": 2, "starting_step": 3}))
    state.next_batch()
    env = state.register_env(RegisterEnv(max_token_length=64, desired_name="e", weight=0.5,
                                         group_size=2, min_batch_allocation=None))["env_id"]
    groups = [ScoredData(**make_group(2, env_id=env, seed=i)) for i in range(3)]
    state.ingest(groups)
    state.ingest([ScoredData(**make_group(1, env_id=env, seed=9))])  # buffered partial
    body, info = state.next_batch()
    assert info["step"] == 4
    state.close()

    again = ApiState(settings)
    assert again.info() == {"batch_size": 2, "max_token_len": 256}
    assert again.status() == {"current_step": 4, "queue_size": 2}
    assert again.envs[env].real_name == "e_0" and again.started
    assert again.buffered_groups == 1
    body, info = again.next_batch()
    assert info["step"] == 5 and b'"env_id":0' in body
    assert again.latest_example() != b""
    again.close()


def test_newer_schema_is_refused(tmp_path) -> None:
    path = tmp_path / "future.db"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version=99")
    with pytest.raises(ValueError, match="newer"):
        ApiState(ApiSettings(db=path))


def test_busy_file_is_refused(tmp_path) -> None:
    settings = ApiSettings(db=tmp_path / "busy.db")
    first = ApiState(settings)
    try:
        with pytest.raises(ValueError, match="another run-api"):
            ApiState(settings)
    finally:
        first.close()
    ApiState(settings).close()  # free again once the first closed
