"""atropos-launch --ray on a real two-node Ray cluster on 127.0.0.1 whose nodes share no /tmp.

Each test starts the cluster with ``tests/fixtures/ray_nodes.py`` inside a network namespace of
its own (loopback only), so Ray, run-api, vLLM and the envs talk over 127.0.0.1 and nothing else
on the machine is touched. Node ``node_a`` is the head, in this process's mount namespace (the
launching host); node ``node_b`` has a fresh tmpfs over /tmp, so it sees none of this test's
files (its run directory, the launch config) and this test sees none of what it writes except
through the launcher.

Needs root (``unshare -n``/``-m``), Ray (``pip install 'atroposlib[ray]'``) and the bundled
model; run under the machine's heavy-work lock: ``flock /tmp/atropos-heavy.lock pytest ...``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from atroposlib.inference.bundled import bundled_model_dir

REPO = Path(__file__).resolve().parents[2]
BUNDLED = bundled_model_dir()
HARNESS = REPO / "tests" / "fixtures" / "ray_nodes.py"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("ip") is None
                       or os.geteuid() != 0, reason="needs root with unshare and ip (network namespaces)"),
    # The session fixture builds the bundled model when it is missing (a fresh machine).
    pytest.mark.usefixtures("bundled_model_dir"),
]


def _needs_ray() -> None:
    pytest.importorskip("ray", reason="pip install 'atroposlib[ray]'")


def _on_cluster(tmp_path: Path, script: str, timeout: float) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``bash -c script`` (``$PY`` = this Python) next to a fresh two-node cluster."""
    nodes = tmp_path / "nodes.json"
    proc = subprocess.run(
        ["unshare", "-n", sys.executable, str(HARNESS), "--out", str(nodes), "--log-dir",
         str(tmp_path / "ray-logs"), "--", "bash", "-c", script],
        cwd=REPO, env={**os.environ, "PY": sys.executable, "PYTHONUNBUFFERED": "1"},
        capture_output=True, text=True, timeout=timeout)
    assert nodes.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(nodes.read_text())["nodes"]


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.timeout(900)
def test_parts_land_where_placed_and_a_part_that_dies_stops_the_run(tmp_path):
    _needs_ray()
    from tests.example_trainer.test_grpo_loop import make_tiny_model

    (tmp_path / "tiny").mkdir()
    model = make_tiny_model(tmp_path / "tiny")  # in this test's /tmp, which only node_a sees
    dies = _write(tmp_path / "dies.yaml", {
        "run_dir": str(tmp_path / "run"), "stop_timeout": 20,
        "ray": {"node_run_dir": str(tmp_path / "nodes"), "place_timeout": 120},
        "api": {"placement": {"resources": {"node_b": 0.1}}},
        "trainer": {"model": str(model), "vllm_url": "http://127.0.0.1:9/v1", "weight_sync": "none",
                    "training_steps": 2, "batch_size": 4, "micro_batch_size": 4,
                    "placement": {"resources": {"node_a": 0.1}}},
        "envs": [{"name": "crashy", "script": str(REPO / "tests/fixtures/crashing_env.py"),
                  "placement": {"resources": {"node_b": 0.1}}}]})
    unplaceable = _write(tmp_path / "unplaceable.yaml", {
        "run_dir": str(tmp_path / "run2"), "ray": {"place_timeout": 5},
        "api": {"placement": {"resources": {"gpu_node": 1}}},
        "envs": [{"name": "a", "script": str(REPO / "tests/fixtures/crashing_env.py")}]})
    proc, nodes = _on_cluster(tmp_path, (
        f'"$PY" -m atroposlib.cli.launch {dies} --ray; echo "dies exit $?"; '
        f'"$PY" -m atroposlib.cli.launch {unplaceable} --ray "$RAY_ADDRESS"; echo "unplaceable exit $?"'),
        timeout=800)
    out = proc.stdout
    assert "dies exit 1" in out, out[-5000:] + proc.stderr[-3000:]
    placement = json.loads((tmp_path / "run" / "placement.json").read_text())
    assert {k: v["node_id"] for k, v in placement.items()} == {
        "api": nodes["node_b"], "trainer": nodes["node_a"], "crashy": nodes["node_b"]}
    # the env on node_b said why, with its prefix, and the run stopped naming it
    assert "[crashy] env says: cannot load my dataset" in out
    assert "FAILED: crashy exited early with code 3" in out
    for part in ("crashy", "trainer", "api"):
        assert f"[launch] stopped {part}" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stopped"] == "error" and summary["failed_part"] == "crashy"
    assert summary["error"] == "crashy exited early with code 3"
    # each log streamed back to the launching host; node_b's own copies stayed on node_b
    logs = tmp_path / "run" / "logs"
    assert "env says: cannot load my dataset" in (logs / "crashy.log").read_text()
    assert "Uvicorn running on http://127.0.0.1" in (logs / "api.log").read_text()
    assert "[grpo] registered with" in (logs / "trainer.log").read_text()
    node_dir = tmp_path / "nodes" / "run" / "logs"
    assert (node_dir / "trainer.log").exists()  # node_a's own copy (node_a is this host)
    assert not (node_dir / "crashy.log").exists() and not (node_dir / "api.log").exists()

    assert "unplaceable exit 1" in out
    assert "Ray found no room for api on a node within 5s: it asks for {'resources': {'gpu_node': 1.0}}" in out


@pytest.mark.timeout(1500)
def test_quickstart_trains_on_two_nodes_and_brings_the_run_back(tmp_path):
    _needs_ray()
    # the shipped example (the quickstart placed on node_a/node_b), with a budget of 2 steps:
    # a second step trains on a batch sampled after the first reload
    config = yaml.safe_load((REPO / "configs/quickstart-ray.yaml").read_text())
    config["trainer"].update(training_steps=2, eval_interval=0)
    config["trainer"].pop("max_train_seconds")
    config["envs"][0]["args"]["env.eval_size"] = 8
    config["envs"][0]["script"] = str(REPO / config["envs"][0]["script"])
    config["ray"].update(node_run_dir=str(tmp_path / "nodes"), place_timeout=120)
    config["run_dir"] = str(tmp_path / "run")
    path = _write(tmp_path / "quickstart.yaml", config)
    proc, nodes = _on_cluster(tmp_path, f'"$PY" -m atroposlib.cli.launch {path} --ray', timeout=1400)
    out = proc.stdout
    run = tmp_path / "run"
    assert proc.returncode == 0, out[-6000:] + proc.stderr[-3000:]
    placement = json.loads((run / "placement.json").read_text())
    assert {k: v["node_id"] for k, v in placement.items()} == {
        "api": nodes["node_a"], "trainer": nodes["node_b"], "arithmetic": nodes["node_a"]}
    for part in ("api", "trainer", "arithmetic"):
        assert f"\n[{part}] " in out
    # the run's files came back from node_b, whose run directory this host cannot see
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["stopped"] == "completed", summary
    assert summary["node_run_dir"] == str(tmp_path / "nodes" / "run")
    assert not (tmp_path / "nodes" / "run" / "summary.json").exists()
    assert summary["final_checkpoint"] == str(run / "checkpoints" / "final")
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2]
    # the trainer reloaded its vLLM on node_b after the steps, and the envs sampled from it
    assert sum(m.get("sync/update_seconds", 0.0) for m in steps) > 0
    assert summary["eval_accuracy_before"] is not None and summary["eval_accuracy_after"] is not None
    # the final checkpoint is whole here, and it trained: a top layer moved
    from safetensors import safe_open

    name = "model.layers.29.mlp.down_proj.weight"
    with safe_open(run / "checkpoints/final/model.safetensors", "pt") as new, \
            safe_open(BUNDLED / "model.safetensors", "pt") as old:
        assert new.keys() == old.keys()
        assert not new.get_tensor(name).equal(old.get_tensor(name))
    assert (run / "plot.png").stat().st_size > 1000
    assert "[grpo] registered with" in (run / "logs" / "trainer.log").read_text()


FEED = """
import sys, time
from atroposlib.api.client import AtroposClient
from tests.example_trainer.test_grpo_loop import _group
# the API comes up only once Ray has placed it, which can take minutes on a slow machine: retry
# a refused connection for as long as the trainer waits for a batch
with AtroposClient(sys.argv[1], max_attempts=10**6, max_retry_seconds=540) as client:
    deadline = time.monotonic() + 540
    while (client.info() or {}).get("batch_size", -1) <= 0:
        assert time.monotonic() < deadline, "the trainer never registered"
        time.sleep(1)
    for seed in range(4):
        client.post_scored_data(_group(seed))
print("fed 4 groups", flush=True)
"""


@pytest.mark.timeout(900)
def test_a_trainer_over_two_ray_nodes_meets_at_a_static_rendezvous(tmp_path):
    _needs_ray()
    port = 18555  # free: the cluster has a network namespace of its own
    config = _write(tmp_path / "two.yaml", {
        "run_dir": str(tmp_path / "run"),
        "ray": {"node_run_dir": str(tmp_path / "nodes"), "place_timeout": 120},
        "api": {"port": port, "placement": {"resources": {"node_a": 0.1}}},
        # one rank on each node (a placement group spreads the two bundles); the bundled model's
        # path is outside /tmp, so both nodes read it
        "trainer": {"model": str(BUNDLED), "vllm_url": "http://127.0.0.1:9/v1", "weight_sync": "none",
                    "training_steps": 2, "batch_size": 8, "micro_batch_size": 4, "lr": 1e-4,
                    "train_last_layers": 2, "dtype": "float32", "torch_threads": 1, "batch_timeout": 600,
                    "nnodes": 2, "nproc_per_node": 1, "placement": {"num_cpus": 1}},
        "envs": [{"name": "idle", "script": str(REPO / "tests/fixtures/idle_env.py"),
                  "placement": {"resources": {"node_a": 0.1}}}]})
    feed = tmp_path / "feed.py"
    feed.write_text(FEED)
    proc, nodes = _on_cluster(tmp_path, (
        # a feeder that gives up stops the launcher at once, not after the trainer's batch timeout
        f'"$PY" {feed} http://127.0.0.1:{port} & FEEDER=$!; '
        f'"$PY" -m atroposlib.cli.launch {config} --ray & LAUNCHER=$!; '
        'wait $FEEDER || { kill -TERM $LAUNCHER; wait $LAUNCHER; exit 1; }; wait $LAUNCHER'), timeout=800)
    out = proc.stdout
    assert proc.returncode == 0, out[-6000:] + proc.stderr[-3000:]
    assert "fed 4 groups" in out
    placement = json.loads((tmp_path / "run" / "placement.json").read_text())
    assert {placement["trainer"]["node_id"], placement["trainer.1"]["node_id"]} == set(nodes.values())
    assert "[trainer.1] " in out  # the second node's torchrun streams with its own prefix
    trainer_log = (tmp_path / "run" / "logs" / "trainer.log").read_text()
    assert "x 2 ranks (FSDP)" in trainer_log
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["stopped"] == "completed"
    assert (tmp_path / "run" / "checkpoints" / "final" / "model.safetensors").exists()


@pytest.mark.timeout(1500)
def test_an_inference_node_on_the_other_node_gets_the_weights_over_http(tmp_path):
    _needs_ray()
    config = yaml.safe_load((REPO / "configs/quickstart-ray.yaml").read_text())
    config["trainer"].update(training_steps=2, eval_interval=0)
    for key in ("max_train_seconds", "vllm_dtype", "vllm_max_model_len"):
        config["trainer"].pop(key)
    config["envs"][0]["args"]["env.eval_size"] = 8
    config["envs"][0]["script"] = str(REPO / config["envs"][0]["script"])
    # vLLM on node_a; the trainer on node_b, whose run directory node_a cannot see
    config["inference"] = [{"placement": {"resources": {"node_a": 0.1}},
                            "args": {"dtype": "bfloat16", "max_model_len": 512}}]
    config["ray"].update(node_run_dir=str(tmp_path / "nodes"), place_timeout=120)
    config["run_dir"] = str(tmp_path / "run")
    path = _write(tmp_path / "nodes.yaml", config)
    proc, nodes = _on_cluster(tmp_path, f'ATROPOS_API_KEY=test-key-1 "$PY" -m atroposlib.cli.launch {path} --ray',
                              timeout=1400)
    out = proc.stdout
    run = tmp_path / "run"
    assert proc.returncode == 0, out[-6000:] + proc.stderr[-3000:]
    placement = json.loads((run / "placement.json").read_text())
    assert {k: v["node_id"] for k, v in placement.items()} == {
        "api": nodes["node_a"], "inference": nodes["node_a"], "trainer": nodes["node_b"],
        "arithmetic": nodes["node_a"]}
    assert "\n[inference] " in out
    trainer_log = (run / "logs" / "trainer.log").read_text()
    # node_b's run directory is hidden from the node: every policy went over HTTP
    assert "-> weights pushed over HTTP in bfloat16" in trainer_log, trainer_log[-3000:]
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m.get("sync/bytes_sent", 0) > 0 for m in steps[1:])  # step 1 may overlap its push
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["stopped"] == "completed", summary
    assert summary["eval_accuracy_before"] is not None and summary["eval_accuracy_after"] is not None
