"""End to end: atropos-launch runs run-api, the arithmetic env (serve) and 2 GRPO steps, sampling from
real vLLM or (rollout_engine hf) from the trainer's own process."""

import json
from pathlib import Path

import httpx
import pytest
import yaml

from atroposlib.cli.launch import Launcher, load_config

REPO = Path(__file__).resolve().parents[2]


def _launch(tmp_path: Path, trainer: dict) -> tuple[int, Path]:
    """Run ``trainer`` with the arithmetic env (difficulty 1, groups of 4) and its eval; (exit code, run dir)."""
    run_dir = tmp_path / "run"
    config = {
        "run_dir": str(run_dir), "trainer": trainer,
        "envs": [{"name": "arithmetic", "script": str(REPO / "environments/arithmetic_server.py"),
                  "args": {"env.group_size": 4, "env.max_tokens": 12, "env.difficulty": 1,
                           "env.eval_size": 8, "env.use_wandb": False,
                           "env.ensure_scores_are_not_same": False}}],
        "eval_env": "arithmetic",
    }
    path = tmp_path / "e2e.yaml"
    path.write_text(yaml.safe_dump(config))
    return Launcher(load_config(path)).run(), run_dir


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_two_grpo_steps_with_real_vllm_reload_and_eval(vllm_server, tmp_path):
    try:
        code, run_dir = _launch(tmp_path, {
            "model": str(vllm_server.model_dir), "vllm_url": vllm_server.base_url,
            "served_model_name": vllm_server.model_name, "weight_sync": "reload",
            "weight_sync_overlap": True,  # as the quickstart: the reload of step k overlaps step k+1
            "training_steps": 2, "batch_size": 8, "micro_batch_size": 8, "lr": 1e-6,
            "train_last_layers": 2, "torch_threads": 1, "max_token_len": 256, "batch_timeout": 600,
        })
        summary = json.loads((run_dir / "summary.json").read_text())
        assert code == 0, (run_dir / "logs" / "trainer.log").read_text()[-3000:]
        assert summary["steps"] == 2
        assert 0.0 <= summary["eval_accuracy_before"] <= 1.0
        assert 0.0 <= summary["eval_accuracy_after"] <= 1.0
        assert summary["mean_sync_update_seconds"] is not None
        # every step reports how long it waited for the previous step's background sync
        assert all("sync/wait_seconds" in m for m in
                   (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
                   if "loss" in m)
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [m for m in metrics if "loss" in m]
        assert [m["step"] for m in steps] == [1, 2]
        for m in steps:
            assert m["sequences"] == 8 and m["trained_tokens"] > 0
            # sampler and trainer are both fp32 here: their log-probs agree closely
            assert m["sampler_logprob_diff"] < 0.05
        assert (run_dir / "plot.png").stat().st_size > 1000
        assert (run_dir / "checkpoints" / "final" / "model.safetensors").exists()
        for name in ("api", "trainer", "arithmetic", "eval"):
            assert (run_dir / "logs" / f"{name}.log").exists(), name
    finally:
        # put the shared session server back on the bundled weights for later tests
        httpx.post(f"{vllm_server.root_url}/collective_rpc", timeout=300,
                   json={"method": "reload_weights", "kwargs": {"weights_path": str(vllm_server.model_dir)}})
        httpx.post(f"{vllm_server.root_url}/reset_prefix_cache", timeout=60)


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_two_lora_steps_sampled_by_the_trainer_itself(bundled_model_dir, tmp_path):
    code, run_dir = _launch(tmp_path, {
        "model": str(bundled_model_dir), "rollout_engine": "hf", "served_model_name": "smollm2",
        "training_steps": 2, "batch_size": 8, "micro_batch_size": 4, "lr": 3e-4,
        "lora_r": 8, "lora_alpha": 16, "train_last_layers": 2, "gradient_checkpointing": True,
        "torch_threads": 1, "max_token_len": 96, "vllm_max_model_len": 256, "batch_timeout": 600,
    })
    log = (run_dir / "logs" / "trainer.log").read_text()
    assert code == 0, log[-3000:]
    assert "sampling in this process (rollout_engine hf)" in log
    assert "starting vLLM" not in log and not (run_dir / "logs" / "vllm.log").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2
    assert 0.0 <= summary["eval_accuracy_before"] <= 1.0
    assert 0.0 <= summary["eval_accuracy_after"] <= 1.0
    steps = [m for m in (json.loads(line) for line in
                         (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["sequences"] == 8 and m["trained_tokens"] > 0
        assert m["sync/update_seconds"] == 0  # nothing to send: the sampler reads the live weights
    # step 1 trains on rollouts of the starting weights, the very weights it computes with, in the
    # same precision: the log-probs agree (step 2's may come from the weights before step 1)
    assert steps[0]["sampler_logprob_diff"] < 1e-3
    assert (run_dir / "checkpoints" / "final" / "adapter").is_dir()
