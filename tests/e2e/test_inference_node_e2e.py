"""End to end: two atropos-inference-nodes, each in its own mount namespace; one is killed and restarted mid-run.

Each node runs under ``unshare -m`` with a tmpfs over /tmp and over the trainer's run directory,
so nothing the trainer writes is visible to it: every update has to travel over HTTP. The test
trains GRPO steps at a high learning rate through ``--vllm-url`` (both nodes) with the
arithmetic env sampling from both. After step 2 it kills one node with SIGKILL (the node and its
vLLM processes, no shutdown), then checks what docs/inference-node.md promises:

* the trainer marks the dead node stale (one warning naming it) and keeps training;
* the env routes around it: it sees the node go unhealthy, and the healthy node serves the
  rollouts of the steps trained meanwhile;
* restarted on its own empty disk, the node is re-sent the current weights before it serves
  (it answers 503 until then, and its first completion carries a version pushed after the kill);
* at the end it serves the trainer's final weights: each prompt token's log-prob within
  ``LOGPROB_GAP`` of an HF forward of ``checkpoints/final``;
* a wrong key and a damaged push are refused while the weights keep serving.

While the killed node restarts, the test pauses the env (SIGSTOP): with no new rollouts the
trainer waits for its next batch instead of finishing before the node is back.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from atroposlib.inference.node.models import POLICY_VERSION_HEADER, content_digest
from tests.fixtures.api_server import free_port

REPO = Path(__file__).resolve().parents[2]
KEY = "e2e-node-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\nThe answer is 12."
#: Largest per-token log-prob gap between a node and an HF fp32 forward of the same weights
#: (docs/inference-node.md states this figure).
LOGPROB_GAP = 1e-3
TRAINING_STEPS = 7

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2700)]


def _can_unshare() -> str | None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "needs root and unshare(1) for a private mount namespace"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare -m failed: {probe.stderr.strip()}"


class HiddenNode:
    """``atropos-inference-node`` in a mount namespace that hides /tmp and ``hidden``."""

    def __init__(self, name: str, hidden: Path, log_dir: Path):
        self.name, self.hidden, self.log_dir = name, hidden, log_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def log(self) -> Path:
        return self.log_dir / f"{self.name}-{self.starts}.log"

    def start(self) -> None:
        """Start the node; :meth:`wait_healthy` waits for it."""
        self.starts += 1
        node = [sys.executable, "-m", "atroposlib.cli.inference_node", "--port", str(self.port),
                "--dtype", "float32", "--log", str(self.log_dir / f"{self.name}-vllm-{self.starts}.log")]
        script = (f"mount -t tmpfs tmpfs {self.hidden} && mount -t tmpfs tmpfs /tmp && "
                  f"exec {' '.join(node)}")
        out = open(self.log, "wb")  # noqa: SIM115 - child owns it
        self.proc = subprocess.Popen(["unshare", "-m", "sh", "-c", script], stdout=out,
                                     stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                     env={**os.environ, "ATROPOS_API_KEY": KEY})

    def wait_healthy(self, timeout: float = 900) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout  # ~30 s idle; minutes on a loaded 2-core machine
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-4000:]
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise AssertionError(f"node {self.name} did not become healthy in {timeout:.0f} s")

    def kill(self) -> None:
        """SIGKILL the node and every process under it (its vLLM server and engine): no shutdown."""
        assert self.proc is not None
        procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        gone, alive = psutil.wait_procs(procs, timeout=30)
        assert not alive, alive

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the node stops its vLLM process group
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()

    def status(self) -> dict:
        return httpx.get(f"{self.url}/atropos/status", headers=AUTH, timeout=10).json()

    def completions_served(self) -> float:
        """Completions this node's vLLM has finished (its Prometheus ``/metrics``)."""
        text = httpx.get(f"{self.url}/metrics", headers=AUTH, timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:request_success_total{"))


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


def _gap(a: list[float], b: list[float]) -> float:
    """Largest per-token absolute log-prob difference."""
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def _steps_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return max((json.loads(line).get("step", 0) for line in path.read_text().splitlines()
                if '"loss"' in line), default=0)


def _wait(what: str, done, launch: subprocess.Popen, run_dir: Path, timeout: float = 900):
    """Poll ``done()`` until it returns something true; fail if training stops or time runs out."""
    deadline = time.monotonic() + timeout
    while not (result := done()):
        trainer_log = run_dir / "logs" / "trainer.log"
        assert launch.poll() is None, f"training stopped while waiting for {what}: " + (
            trainer_log.read_text()[-4000:] if trainer_log.exists() else "")
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.5)
    return result


def _env_processes(launch: subprocess.Popen) -> list[psutil.Process]:
    return [p for p in psutil.Process(launch.pid).children(recursive=True)
            if any("arithmetic_server.py" in part for part in p.cmdline())]


def test_training_through_two_nodes_survives_one_killed_and_re_syncs_it(bundled_model_dir, tmp_path):
    reason = _can_unshare()
    if reason:
        pytest.skip(reason)
    from transformers import AutoTokenizer

    run_dir = tmp_path / "run"
    log_dir = Path(tempfile.mkdtemp(prefix="node-e2e-", dir="/var/tmp"))  # outside the hidden /tmp
    killed, healthy = HiddenNode("killed", tmp_path, log_dir), HiddenNode("healthy", tmp_path, log_dir)
    launch = None
    stopped_envs: list[psutil.Process] = []
    try:
        for node in (killed, healthy):
            node.start()
        for node in (killed, healthy):
            node.wait_healthy()
            assert node.status()["state"] == "awaiting_weights"
        config = {
            "run_dir": str(run_dir),
            "trainer": {
                "model": str(bundled_model_dir), "vllm_url": f"{killed.url}/v1,{healthy.url}/v1",
                "vllm_api_key": KEY, "weight_sync": "reload", "weight_sync_timeout": 60,
                "training_steps": TRAINING_STEPS, "batch_size": 8, "micro_batch_size": 8,
                "lr": 2e-4, "train_last_layers": 4,
                # AdamW's decoupled decay moves the weights every step even when a batch has no
                # advantage (all rewards equal): the final weights always differ from the start
                "weight_decay": 10.0,
                "torch_threads": 1, "max_token_len": 256, "batch_timeout": 900,
                "checkpoint_interval": 0,
                # groups more than one step old are dropped: every step needs fresh rollouts
                "max_staleness": 1,
            },
            # the launcher gives the env both nodes (and the key) in a servers file
            "envs": [{"name": "arithmetic", "script": str(REPO / "environments/arithmetic_server.py"),
                      "args": {"env.group_size": 4, "env.max_tokens": 24, "env.difficulty": 1,
                               "env.use_wandb": False, "env.ensure_scores_are_not_same": False}}],
        }
        (tmp_path / "launch.yaml").write_text(yaml.safe_dump(config))
        launch = subprocess.Popen([sys.executable, "-m", "atroposlib.cli.launch",
                                   str(tmp_path / "launch.yaml")], cwd=REPO,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        trainer_log = run_dir / "logs" / "trainer.log"
        _wait("step 2", lambda: _steps_done(run_dir) >= 2, launch, run_dir)

        # the node dies mid-run: SIGKILL, no shutdown
        served_before = healthy.completions_served()
        killed.kill()
        killed_at = _steps_done(run_dir)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{killed.url}/health", timeout=5)

        # the trainer marks it stale at its next sync and trains on
        stale = re.compile(rf"WARNING: inference node {re.escape(killed.url)} missed the weight "
                           r"sync to policy version (\d+) .*It is marked stale")
        missed = int(_wait("stale warning", lambda: stale.search(trainer_log.read_text()),
                           launch, run_dir).group(1))
        assert missed >= killed_at
        _wait(f"step {missed + 1}", lambda: _steps_done(run_dir) >= missed + 1, launch, run_dir)
        # ... and the env routed around it: it saw the node go, the other node served the steps
        env_log = run_dir / "logs" / "arithmetic.log"
        _wait("the env's word that the node is down", lambda: f"inference server {killed.url}/v1 "
              "is now UNHEALTHY" in env_log.read_text(), launch, run_dir, timeout=120)
        served_meanwhile = healthy.completions_served() - served_before
        assert served_meanwhile > 0
        print(f"killed after step {killed_at}; missed version {missed}; the healthy node served "
              f"{served_meanwhile:.0f} completions while the other was down")

        # hold the rollouts, so the trainer waits for its next batch while the node restarts
        stopped_envs = _env_processes(launch)
        assert stopped_envs
        for proc in stopped_envs:
            proc.send_signal(signal.SIGSTOP)
        killed.start()  # back on its own empty disk, awaiting weights
        killed.wait_healthy()
        answers: list[tuple[int, str | None]] = []  # (HTTP status, policy version) of each try
        deadline = time.monotonic() + 300
        while not answers or answers[-1][0] != 200:
            assert time.monotonic() < deadline, f"not re-synced within 300 s: {answers[-5:]}"
            answer = httpx.post(f"{killed.url}/v1/completions", headers=AUTH, timeout=120, json={
                "model": "smollm2", "prompt": "1 + 1 =", "max_tokens": 1})
            answers.append((answer.status_code, answer.headers.get(POLICY_VERSION_HEADER)))
            time.sleep(0.2)
        # it answered 503 until it had weights, and then served a version pushed after its death
        assert {code for code, _ in answers[:-1]} <= {503}, answers
        first_version = int(answers[-1][1] or -1)
        assert missed <= first_version <= healthy.status()["policy_version"], (answers, missed)
        assert f"inference node {killed.url} is back: re-sent policy version" in trainer_log.read_text()
        print(f"restarted node: {len(answers) - 1} answer(s) 503, then version {first_version}")
        for proc in stopped_envs:
            proc.send_signal(signal.SIGCONT)
        stopped_envs = []

        assert launch.wait(1200) == 0, trainer_log.read_text()[-4000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        log_text = trainer_log.read_text()
        print(summary, "\n".join(line for line in log_text.splitlines() if "inference node" in line))

        # training went on and the node was healed: warned once, every missed sync counted
        assert summary["steps"] == TRAINING_STEPS
        assert summary["weight_sync_paths"] == {killed.url: "http", healthy.url: "http"}
        assert summary["stale_nodes"] == []
        assert log_text.count(f"WARNING: inference node {killed.url}") == 1
        assert log_text.count("WARNING: inference node") == 1
        assert summary["weight_sync_failures"] >= 1
        # after a node's first full push, pushes are deltas; the restarted node was re-sent the
        # full weights, and got deltas after that if training went on
        sources = {"http", "delta"}
        for node in (killed, healthy):
            status = node.status()
            assert status["policy_version"] == TRAINING_STEPS and status["last_update"]["source"] in sources
            sources = {"delta"}

        # the restarted node serves the trainer's final weights, not the starting model's
        ids = AutoTokenizer.from_pretrained(bundled_model_dir)(PROMPT).input_ids
        version, served = _node_logprobs(killed, ids)
        final = _hf_logprobs(run_dir / "checkpoints" / "final", ids)
        base = _hf_logprobs(bundled_model_dir, ids)
        print(f"largest per-token |log-prob difference| over {len(ids) - 1} prompt tokens: node vs "
              f"final checkpoint {_gap(served, final):.2e}, node vs base {_gap(served, base):.2e}")
        assert version == str(TRAINING_STEPS)
        assert _gap(served, final) < LOGPROB_GAP
        assert _gap(served, base) > 10 * LOGPROB_GAP  # training moved them: the check can fail

        # a wrong key is refused; a damaged push is refused and the weights keep serving
        assert httpx.get(f"{killed.url}/atropos/status",
                         headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.post(f"{killed.url}/v1/completions", json={"model": "smollm2", "prompt": "x"},
                          headers={"Authorization": "Bearer wrong"}).status_code == 401
        from safetensors.torch import load_file, save

        body = save({k: v for k, v in load_file(bundled_model_dir / "model.safetensors").items()
                     if k == "model.norm.weight"})
        damaged = httpx.put(f"{killed.url}/atropos/weights?version={TRAINING_STEPS + 1}",
                            content=body[:-1] + b"\0",
                            headers={**AUTH, "Content-Digest": content_digest(body)}, timeout=60)
        assert damaged.status_code == 400 and "does not match" in damaged.json()["detail"]
        version_after, served_after = _node_logprobs(killed, ids)
        assert version_after == str(TRAINING_STEPS)
        assert _gap(served_after, served) < 1e-4
    finally:
        for proc in stopped_envs:
            proc.send_signal(signal.SIGCONT)
        if launch is not None and launch.poll() is None:
            os.killpg(launch.pid, signal.SIGTERM)
            launch.wait(120)
        for node in (killed, healthy):
            node.stop()
        shutil.rmtree(log_dir, ignore_errors=True)
