"""End to end: atropos-launch with rollout_engine hf: the trainer samples in its own process, no vLLM."""

import json
from pathlib import Path

import psutil
import pytest
import yaml

from atroposlib.cli.launch import Launcher, load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_two_lora_steps_sampled_by_the_trainer_itself(bundled_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    config = {
        "run_dir": str(run_dir),
        "trainer": {
            "model": str(bundled_model_dir), "rollout_engine": "hf", "served_model_name": "smollm2",
            "training_steps": 2, "batch_size": 8, "micro_batch_size": 4, "lr": 3e-4,
            "lora_r": 8, "lora_alpha": 16, "train_last_layers": 2, "gradient_checkpointing": True,
            "torch_threads": 1, "max_token_len": 96, "vllm_max_model_len": 256, "batch_timeout": 600,
        },
        "envs": [{"name": "arithmetic", "script": str(REPO / "environments/arithmetic_server.py"),
                  "args": {"env.group_size": 4, "env.max_tokens": 12, "env.difficulty": 1,
                           "env.eval_size": 8, "env.use_wandb": False,
                           "env.ensure_scores_are_not_same": False}}],
        "eval_env": "arithmetic",
    }
    path = tmp_path / "e2e.yaml"
    path.write_text(yaml.safe_dump(config))
    before = {p.pid for p in psutil.process_iter()}
    code = Launcher(load_config(path)).run()
    log = (run_dir / "logs" / "trainer.log").read_text()
    assert code == 0, log[-3000:]
    assert "sampling in this process (rollout_engine hf)" in log
    assert not (run_dir / "logs" / "vllm.log").exists()
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
                and "vllm" in " ".join(p.info["cmdline"] or [])]
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
        # the same weights in the same precision sampled and trained: the log-probs agree
        assert m["sampler_logprob_diff"] < 1e-3
    assert (run_dir / "checkpoints" / "final" / "adapter").is_dir()
