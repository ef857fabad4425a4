"""End to end: atropos-inference-node in its own mount namespace, trained through over HTTP, killed and restarted.

The node runs under ``unshare -m`` with a tmpfs over /tmp and over the trainer's run directory,
so nothing the trainer writes is visible to it: every update has to travel over HTTP. The test
trains 5 GRPO steps at a high learning rate through ``--vllm-url``, stops the node after step 2
and starts it again, then checks that the node serves the trainer's final weights (its prompt
log-probabilities match an HF forward of ``checkpoints/final`` more closely than the starting
model's), that the outage was warned about once, counted and healed, and that a wrong key and a
damaged push are refused while the weights keep serving.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

from atroposlib.inference.node.models import POLICY_VERSION_HEADER, content_digest
from tests.fixtures.api_server import free_port

REPO = Path(__file__).resolve().parents[2]
KEY = "e2e-node-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\nThe answer is 12."

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]


def _can_unshare() -> str | None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "needs root and unshare(1) for a private mount namespace"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare -m failed: {probe.stderr.strip()}"


class HiddenNode:
    """``atropos-inference-node`` in a mount namespace that hides /tmp and ``hidden``."""

    def __init__(self, port: int, hidden: Path, log_dir: Path):
        self.port, self.hidden, self.log_dir = port, hidden, log_dir
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        node = [sys.executable, "-m", "atroposlib.cli.inference_node", "--port", str(self.port),
                "--dtype", "float32", "--log", str(self.log_dir / f"vllm-{self.starts}.log")]
        script = (f"mount -t tmpfs tmpfs {self.hidden} && mount -t tmpfs tmpfs /tmp && "
                  f"exec {' '.join(node)}")
        out = open(self.log_dir / f"node-{self.starts}.log", "wb")  # noqa: SIM115 - child owns it
        self.proc = subprocess.Popen(["unshare", "-m", "sh", "-c", script], stdout=out,
                                     stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                     env={**os.environ, "ATROPOS_API_KEY": KEY})
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.log_dir / f"node-{self.starts}.log").read_text()
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise AssertionError("the node did not become healthy in 300 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the node stops its vLLM process group
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def status(self) -> dict:
        return httpx.get(f"{self.url}/atropos/status", headers=AUTH, timeout=10).json()


def _node_logprobs(node: HiddenNode, ids: list[int]) -> tuple[str, list[float]]:
    answer = httpx.post(f"{node.url}/v1/completions", headers=AUTH, timeout=120, json={
        "model": "smollm2", "prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 1,
        "temperature": 0})
    answer.raise_for_status()
    return (answer.headers[POLICY_VERSION_HEADER],
            [float(x) for x in answer.json()["choices"][0]["logprobs"]["token_logprobs"][1:len(ids)]])


def _hf_logprobs(model_dir: Path, ids: list[int]) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
    return [logp[i, ids[i + 1]].item() for i in range(len(ids) - 1)]


def _distance(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


def _steps_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return max((json.loads(line).get("step", 0) for line in path.read_text().splitlines()
                if '"loss"' in line), default=0)


def test_training_through_a_node_that_shares_no_disk_and_restarts_mid_run(bundled_model_dir, tmp_path):
    reason = _can_unshare()
    if reason:
        pytest.skip(reason)
    from transformers import AutoTokenizer

    run_dir = tmp_path / "run"
    log_dir = Path(tempfile.mkdtemp(prefix="node-e2e-", dir="/var/tmp"))  # outside the hidden /tmp
    node = HiddenNode(free_port(), tmp_path, log_dir)
    launch = None
    try:
        node.start()
        assert node.status()["state"] == "awaiting_weights"
        config = {
            "run_dir": str(run_dir),
            "trainer": {
                "model": str(bundled_model_dir), "vllm_url": f"{node.url}/v1", "vllm_api_key": KEY,
                "weight_sync": "reload", "weight_sync_timeout": 60, "training_steps": 5,
                "batch_size": 8, "micro_batch_size": 8, "lr": 2e-4, "train_last_layers": 4,
                # AdamW's decoupled decay moves the weights every step even when a batch has no
                # advantage (all rewards equal): the final weights always differ from the start
                "weight_decay": 10.0,
                "torch_threads": 1, "max_token_len": 256, "batch_timeout": 600,
                "checkpoint_interval": 0,
                # groups more than one step old are dropped, so the steps after the outage need
                # fresh rollouts from the restarted node: training cannot finish around it
                "max_staleness": 1,
            },
            "envs": [{"name": "arithmetic", "script": str(REPO / "environments/arithmetic_server.py"),
                      "args": {"env.group_size": 4, "env.max_tokens": 24, "env.difficulty": 1,
                               "env.use_wandb": False, "env.ensure_scores_are_not_same": False,
                               "openai.api_key": KEY}}],
        }
        (tmp_path / "launch.yaml").write_text(yaml.safe_dump(config))
        launch = subprocess.Popen([sys.executable, "-m", "atroposlib.cli.launch",
                                   str(tmp_path / "launch.yaml")], cwd=REPO,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        deadline = time.monotonic() + 900
        while _steps_done(run_dir) < 2:
            assert launch.poll() is None and time.monotonic() < deadline, "training stopped early"
            time.sleep(1)
        node.stop()  # the node goes away mid-run ...
        node.start()  # ... and comes back on its own empty disk, awaiting weights
        assert launch.wait(900) == 0, (run_dir / "logs" / "trainer.log").read_text()[-4000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        trainer_log = (run_dir / "logs" / "trainer.log").read_text()
        print(summary, "\n".join(line for line in trainer_log.splitlines() if "inference node" in line))

        # training went on and the node was healed (warned at most once, counted when missed)
        assert summary["steps"] == 5
        assert summary["weight_sync_paths"] == {node.url: "http"}  # the run dir is hidden from it
        assert summary["stale_nodes"] == []
        warnings = trainer_log.count("WARNING: inference node")
        assert warnings <= 1 and (warnings == 0) == (summary["weight_sync_failures"] == 0)
        assert "re-sending" in trainer_log or "is back: re-sent" in trainer_log
        status = node.status()
        assert status["policy_version"] == 5 and status["last_update"]["source"] == "http"

        # the node serves the trainer's final weights, not the starting model's
        ids = AutoTokenizer.from_pretrained(bundled_model_dir)(PROMPT).input_ids
        version, served = _node_logprobs(node, ids)
        final = _hf_logprobs(run_dir / "checkpoints" / "final", ids)
        base = _hf_logprobs(bundled_model_dir, ids)
        print(f"summed |log-prob difference| over {len(ids) - 1} prompt tokens: node vs final "
              f"checkpoint {_distance(served, final):.5f}, node vs base {_distance(served, base):.5f}")
        assert version == "5"
        assert _distance(served, final) < _distance(served, base) / 2, (served, final, base)

        # a wrong key is refused; a damaged push is refused and the weights keep serving
        assert httpx.get(f"{node.url}/atropos/status",
                         headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.post(f"{node.url}/v1/completions", json={"model": "smollm2", "prompt": "x"},
                          headers={"Authorization": "Bearer wrong"}).status_code == 401
        from safetensors.torch import load_file, save

        body = save({k: v for k, v in load_file(bundled_model_dir / "model.safetensors").items()
                     if k == "model.norm.weight"})
        damaged = httpx.put(f"{node.url}/atropos/weights?version=6", content=body[:-1] + b"\0",
                            headers={**AUTH, "Content-Digest": content_digest(body)}, timeout=60)
        assert damaged.status_code == 400 and "does not match" in damaged.json()["detail"]
        version_after, served_after = _node_logprobs(node, ids)
        assert version_after == "5"
        assert _distance(served_after, served) < 1e-3
    finally:
        if launch is not None and launch.poll() is None:
            os.killpg(launch.pid, signal.SIGTERM)
            launch.wait(120)
        node.stop()
        shutil.rmtree(log_dir, ignore_errors=True)
