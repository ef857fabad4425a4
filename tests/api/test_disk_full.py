"""Disk full: with ``--db`` on a full disk, run-api answers 507 with ``Retry-After``, loses nothing,
and takes data again once space is freed.

run-api runs in its own mount namespace on a 2 MiB tmpfs (``unshare -m``, as root); the test
fills that tmpfs through ``/proc/<pid>/root`` and posts from several keep-alive clients at once,
which is when a bare 500 used to come with closed connections (a TCP reset for the next request).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.fixtures.api_server import free_port

from .conftest import REGISTRATION, make_group

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) to mount a small tmpfs in a private mount namespace")

REGISTRATION_BIG = {**REGISTRATION, "batch_size": 2, "max_token_len": 1024}


def start_on_tmpfs(mount: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    script = (f"mount -t tmpfs -o size=2m tmpfs {mount} && exec {sys.executable} -m "
              f"atroposlib.cli.run_api --host 127.0.0.1 --port {port} --db {mount}/q.db")
    proc = subprocess.Popen(["unshare", "-m", "sh", "-c", script], stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            httpx.get(url + "/info", timeout=2)
            return proc, url
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    pytest.fail(f"run-api on tmpfs did not start:\n{log.read_text()[-3000:]}")


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def post_many(url: str, seeds: range, clients: int = 4) -> tuple[Counter, list[httpx.Response]]:
    """POST one group per seed from ``clients`` keep-alive clients at once."""
    outcomes: Counter = Counter()
    answers: list[httpx.Response] = []

    def run(part: list[int]) -> None:
        with httpx.Client(base_url=url, timeout=15) as client:
            for seed in part:
                try:
                    response = client.post("/scored_data", json=make_group(2, length=300, seed=seed))
                except httpx.TransportError as exc:  # a dropped connection: no HTTP answer
                    outcomes[type(exc).__name__] += 1
                    continue
                outcomes[response.status_code] += 1
                answers.append(response)

    seeds_list = list(seeds)
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(run, [seeds_list[i::clients] for i in range(clients)]))
    return outcomes, answers


def test_full_disk_answers_507_loses_nothing_and_recovers(tmp_path: Path) -> None:
    mount = tmp_path / "mnt"
    mount.mkdir()
    log = tmp_path / "run-api.log"
    proc, url = start_on_tmpfs(mount, log)
    inside = Path(f"/proc/{proc.pid}/root") / mount.relative_to("/")
    try:
        assert httpx.post(url + "/register", json=REGISTRATION_BIG).status_code == 200
        assert httpx.get(url + "/batch").status_code == 200
        accepted = [seed for seed in range(3)
                    if httpx.post(url + "/scored_data",
                                  json=make_group(2, length=300, seed=seed)).status_code == 200]
        assert accepted == [0, 1, 2]
        filler = fill(inside)

        outcomes, answers = post_many(url, range(100, 140))
        assert outcomes == Counter({507: 40}), outcomes  # every request answered, none dropped
        assert all(r.headers["retry-after"] == "1" for r in answers)
        assert "the disk of --db is full" in answers[0].json()["detail"]
        env = httpx.post(url + "/register-env", json={"max_token_length": 1024, "desired_name": "e",
                                                      "weight": 1.0, "group_size": 2})
        assert env.status_code == 507
        # serving a batch writes the step: refused too, and nothing is served or lost
        assert httpx.get(url + "/batch").status_code == 507
        assert httpx.get(url + "/status").json() == {"current_step": 0, "queue_size": 3}

        filler.unlink()
        assert httpx.post(url + "/scored_data",
                          json=make_group(2, length=300, seed=3)).status_code == 200
        served = []
        while (batch := httpx.get(url + "/batch").json()["batch"]):
            served += [g["tokens"] for g in batch]
        assert served == [make_group(2, length=300, seed=s)["tokens"] for s in (0, 1, 2, 3)]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
    text = log.read_text()
    assert "Traceback" not in text and "Exception in ASGI application" not in text, text[-4000:]
