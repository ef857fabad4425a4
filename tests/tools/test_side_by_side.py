"""The tools run beside a training run: a trainer pulling /batch still receives every group once."""

import os
import subprocess
import sys
import threading
import time
from collections import Counter

import httpx
import orjson

from atroposlib.api.client import AtroposClient
from atroposlib.tools.observe import GroupObserver, RecentGroups
from tests.fixtures.api_server import start_run_api

N_GROUPS = 12
GROUP_SIZE = 4
SCORES = [1.0, 0.6, 0.0, -1.0]
# SFT (top 3, scores > 0): 1.0 and 0.6 -> 2 lines per group.
# DPO (margin 0.5, pool = 3 lowest {-1, 0, 0.6}): 1.0 vs -1|0, then 0.6 vs the other -> 2 pairs.
EXPECTED_PER_GROUP = 2
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def make_group(tag: str) -> dict:
    answers = [f"{tag} answer {i}" for i in range(GROUP_SIZE)]
    prompt = [{"role": "user", "content": f"question {tag}"}]
    return {
        "tokens": [[1, 2, 3 + i] for i in range(GROUP_SIZE)],
        "masks": [[-100, 2, 3 + i] for i in range(GROUP_SIZE)],
        "scores": SCORES,
        "messages": [prompt + [{"role": "assistant", "content": a}] for a in answers],
    }


def tag_of(group: dict) -> str:
    return group["messages"][0][0]["content"].removeprefix("question ")


def test_tools_beside_a_trainer_lose_nothing(tmp_path):
    api = start_run_api()
    procs = []
    try:
        registration = {"wandb_group": "g", "wandb_project": "p", "batch_size": 2 * GROUP_SIZE,
                        "max_token_len": 2048, "checkpoint_dir": str(tmp_path), "starting_step": 0,
                        "save_checkpoint_interval": 10, "num_steps": 100}
        httpx.post(api.url + "/register", json=registration).raise_for_status()
        expected = [f"g{i:02d}" for i in range(N_GROUPS)]

        # the tools start first and wait for data, as they would beside a real run
        outputs = {"sft": tmp_path / "sft.jsonl", "dpo": tmp_path / "dpo.jsonl"}
        target = str(N_GROUPS * EXPECTED_PER_GROUP)
        for kind, path in outputs.items():
            procs.append(subprocess.Popen(
                [sys.executable, "-m", f"atroposlib.cli.{kind}", str(path), "--api-url", api.url,
                 "--num-seqs-to-save", target, "--poll-interval", "0.2", "--idle-timeout", "90",
                 "--quiet"] + (["--seed", "0"] if kind == "dpo" else []),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV))

        viewer_seen: list[str] = []
        stop = threading.Event()

        def viewer_backend():
            with AtroposClient(api.url) as client:
                feed = RecentGroups(GroupObserver(client, page_size=5), max_groups=1000)
                while True:
                    # refresh before looking at `stop`: stop is set only after every post, so the
                    # last pass always sees every group (no race with the poster's last POST)
                    feed.refresh()
                    viewer_seen[:] = [tag_of(g.group) for g in reversed(feed.snapshot())]
                    if stop.is_set() or len(viewer_seen) >= N_GROUPS:
                        break
                    stop.wait(0.1)

        def poster():
            with AtroposClient(api.url) as client:
                for tag in expected:
                    client.post_scored_data(make_group(tag))
                    time.sleep(0.05)

        trainer_got: list[str] = []

        def trainer():
            with AtroposClient(api.url) as client:
                deadline = time.monotonic() + 120
                while len(trainer_got) < N_GROUPS and time.monotonic() < deadline:
                    batch = client.get_batch()
                    if batch is None:
                        time.sleep(0.05)
                        continue
                    trainer_got.extend(tag_of(g) for g in batch)

        threads = [threading.Thread(target=f) for f in (viewer_backend, trainer, poster)]
        for t in threads:
            t.start()
        for t in threads[1:]:
            t.join(150)
        results = {kind: p.communicate(timeout=150) for kind, p in zip(outputs, procs, strict=True)}
        stop.set()
        threads[0].join(30)

        # the trainer received every group exactly once
        assert sorted(trainer_got) == expected and len(trainer_got) == len(set(trainer_got))
        assert httpx.get(api.url + "/status").json()["queue_size"] == 0
        # each tool wrote the expected lines, covering every group
        for (kind, path), proc in zip(outputs.items(), procs, strict=True):
            assert proc.returncode == 0, results[kind][1]
            rows = [orjson.loads(x) for x in path.read_text().splitlines()]
            assert len(rows) == N_GROUPS * EXPECTED_PER_GROUP, results[kind][1]
            if kind == "sft":
                tags = Counter(r["messages"][0]["content"].removeprefix("question ") for r in rows)
                assert sorted(r["score"] for r in rows) == [0.6] * N_GROUPS + [1.0] * N_GROUPS
            else:
                tags = Counter(r["prompt"][0]["content"].removeprefix("question ") for r in rows)
                assert all(r["score_chosen"] - r["score_rejected"] > 0.5 for r in rows)
            assert tags == dict.fromkeys(expected, EXPECTED_PER_GROUP)
        # the viewer's backend saw every group, in order
        assert viewer_seen == expected
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        api.stop()
