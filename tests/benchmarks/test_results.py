"""benchmarks/results.py: every result file records its command, commit, machine, date and seeds."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pytest

from benchmarks import results


def test_write_result_records_where_the_numbers_came_from(tmp_path):
    path = tmp_path / "deep" / "bench_x_2026-12-06.json"
    record = results.write_result(path, "bench_x", {"rows": [{"seconds": 1.5}], "ratio": 2.0},
                                  seeds={"data": 7}, notes=["first run"],
                                  argv=[str(results.ROOT / "benchmarks" / "bench_x.py"), "--repeats", "3"])
    on_disk = json.loads(path.read_text())
    assert on_disk == record
    meta = on_disk["meta"]
    assert meta["benchmark"] == "bench_x"
    assert meta["command"] == "python benchmarks/bench_x.py --repeats 3"
    assert meta["seeds"] == {"data": 7}
    assert on_disk["rows"] == [{"seconds": 1.5}] and on_disk["ratio"] == 2.0
    assert on_disk["notes"] == ["first run"]
    # the commit is the checkout's own
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=results.ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert meta["git"]["sha"] == head and isinstance(meta["git"]["dirty"], bool)
    assert meta["machine"]["cpu_cores"] == os.cpu_count()
    assert meta["machine"]["ram_bytes"] > 2**28
    assert 1 <= meta["machine"]["cpu_cores_usable"] <= os.cpu_count()
    age = dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(meta["date"])
    assert dt.timedelta(0) <= age < dt.timedelta(minutes=5)


def test_gpu_is_none_without_one(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(results.shutil, "which", lambda name: None)
    assert results.machine()["gpu"] is None


def test_gpu_names_come_from_nvidia_smi(monkeypatch, tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3'\n")
    fake.chmod(0o755)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert results.machine()["gpu"] == ["NVIDIA H100 80GB HBM3"]


def test_outside_a_git_checkout_the_sha_is_none(tmp_path):
    assert results.git_commit(tmp_path) == {"sha": None, "dirty": None}


@pytest.mark.parametrize("key", ["meta", "notes"])
def test_a_payload_may_not_shadow_the_record(tmp_path, key):
    with pytest.raises(ValueError, match=key):
        results.write_result(tmp_path / "x.json", "bench_x", {key: 1}, seeds=None)
    assert not (tmp_path / "x.json").exists()


def test_default_path_is_in_the_results_folder():
    path = results.default_result_path("bench_api", "with_db", day=dt.date(2026, 12, 6))
    assert path == results.RESULTS_DIR / "bench_api_with_db_2026-12-06.json"
    assert results.default_result_path("bench_api", day=dt.date(2026, 1, 2)).name == "bench_api_2026-01-02.json"


def test_read_result_names_a_broken_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        results.read_result(bad)
    with pytest.raises(FileNotFoundError):
        results.read_result(tmp_path / "missing.json")


def test_a_main_called_with_argv_records_that_command(tmp_path):
    argv = results.command_argv(results.ROOT / "benchmarks" / "bench_y.py", ["--steps", "2"])
    record = results.write_result(tmp_path / "y.json", "bench_y", {}, seeds=None, argv=argv)
    assert record["meta"]["command"] == "python benchmarks/bench_y.py --steps 2"
    assert results.command_argv("bench_y.py", None) is None
