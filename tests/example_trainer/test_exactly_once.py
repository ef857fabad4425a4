"""Every batch run-api served reaches the weights once, across a SIGKILL and --resume.

Real run-api, real ``atropos-grpo`` processes, the tiny random Llama. The trainer is killed after
run-api served a batch its last checkpoint does not hold; the resumed trainer fetches that batch
again (``GET /batch?step=N``) instead of training on new groups in its place.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from atroposlib.api.client import AtroposClient
from tests.example_trainer.test_grpo_loop import _group, _load_state, needs_tokenizer, tiny_model  # noqa: F401
from tests.example_trainer.test_resume_lora import _losses, _trainer, _wait
from tests.fixtures.api_server import start_run_api

COMMON = ["--vllm-url", "http://127.0.0.1:9/v1", "--weight-sync", "none", "--batch-size", "8",
          "--micro-batch-size", "4", "--lr", "1e-3", "--batch-timeout", "120", "--torch-threads", "1"]


def _keeping_one_batch() -> tuple[str, ...]:
    """run-api flags that make it keep only the last served batch (the default of older ones)."""
    help_text = subprocess.run([sys.executable, "-m", "atroposlib.cli.run_api", "--help"],
                               capture_output=True, text=True, check=True).stdout
    return ("--replay-batches", "1") if "--replay-batches" in help_text else ()


def _uninterrupted(tiny_model, tmp_path, steps: int, interval: int):  # noqa: F811
    api = start_run_api()
    try:
        with (tmp_path / "a.log").open("wb") as log:
            proc = _trainer("--model", str(tiny_model), "--run-dir", str(tmp_path / "a"), "--api-url",
                            api.url, "--training-steps", str(steps), "--checkpoint-interval",
                            str(interval), *COMMON, log=log)
            with AtroposClient(api.url) as client:
                for seed in range(2 * steps):
                    client.post_scored_data(_group(seed))
            assert proc.wait(300) == 0, (tmp_path / "a.log").read_text()[-3000:]
    finally:
        api.stop()
    return _losses(tmp_path / "a")[1], _load_state(tmp_path / "a" / "checkpoints" / "final")


def _killed_and_resumed(tiny_model, tmp_path, steps: int, interval: int, kill_at: int,  # noqa: F811
                        api_args: tuple[str, ...] = ()):
    """Kill the trainer once run-api served batch ``kill_at`` (after the checkpoint of step
    ``interval``), resume it, and return (losses, final weights, summary, resumed log)."""
    api = start_run_api(*api_args)
    run = tmp_path / "b"
    try:
        with (tmp_path / "b.log").open("wb") as log, AtroposClient(api.url) as client:
            flags = ["--model", str(tiny_model), "--api-url", api.url, "--training-steps", str(steps),
                     "--checkpoint-interval", str(interval), *COMMON]
            proc = _trainer("--run-dir", str(run), *flags, log=log)
            for seed in range(2 * kill_at):
                client.post_scored_data(_group(seed))
            _wait(lambda: (run / "checkpoints" / f"step_{interval}" / "checkpoint.json").exists()
                  and client.status()["current_step"] == kill_at, f"batch {kill_at} served", proc=proc)
            proc.kill()  # SIGKILL: nothing is saved on the way out
            proc.wait(30)
        with (tmp_path / "b2.log").open("wb") as log, AtroposClient(api.url) as client:
            proc = _trainer("--resume", str(run), *flags, log=log)
            for seed in range(2 * kill_at, 2 * steps):
                client.post_scored_data(_group(seed))
            assert proc.wait(300) == 0, (tmp_path / "b2.log").read_text()[-3000:]
            status = client.status()
        assert status["current_step"] == steps and status["queue_size"] == 0  # never renumbered
    finally:
        api.stop()
    summary = json.loads((run / "summary.json").read_text())
    return (_losses(run)[1], _load_state(run / "checkpoints" / "final"), summary,
            (tmp_path / "b2.log").read_text())


def _same_training(expected, got, final_a, final_b):
    assert sorted(got) == sorted(expected)
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-4, abs=1e-6), step
    for key in final_a:
        torch.testing.assert_close(final_b[key], final_a[key], atol=2e-6, rtol=1e-5)


@needs_tokenizer
def test_the_batch_of_the_step_a_sigkill_interrupted_is_trained_again(tiny_model, tmp_path):  # noqa: F811
    """Checkpoint at step 2, killed after run-api served batch 3: the resumed trainer trains
    batch 3 (the same groups), then batch 4, exactly as a trainer that was never killed."""
    expected, final_a = _uninterrupted(tiny_model, tmp_path, steps=4, interval=2)
    got, final_b, summary, log = _killed_and_resumed(tiny_model, tmp_path, steps=4, interval=2,
                                                     kill_at=3)
    assert summary["replayed_batches"] == 1 and summary["lost_batches"] == 0
    assert "training them again (steps 3)" in log
    _same_training(expected, got, final_a, final_b)


@needs_tokenizer
def test_a_batch_run_api_no_longer_keeps_is_one_warning_naming_what_was_lost(tiny_model, tmp_path):  # noqa: F811
    """run-api keeps only the last served batch: of steps 4 and 5 (served after the step-3
    checkpoint) step 4 is gone, which costs one warning, not the run."""
    _, _, summary, log = _killed_and_resumed(tiny_model, tmp_path, steps=6, interval=3, kill_at=5,
                                             api_args=_keeping_one_batch())
    assert summary["steps"] == 6 and summary["stopped"] == "completed"
    assert summary["replayed_batches"] == 1 and summary["lost_batches"] == 1
    warnings = [line for line in log.splitlines() if "no longer keeps" in line]
    assert len(warnings) == 1, log[-3000:]
    assert ("no longer keeps the batches of steps 4 (1 batch(es): 8 sequences, 2 groups by "
            "metrics.jsonl)") in warnings[0]


@needs_tokenizer
def test_every_batch_served_after_the_checkpoint_reaches_the_weights_once(tiny_model, tmp_path):  # noqa: F811
    expected, final_a = _uninterrupted(tiny_model, tmp_path, steps=6, interval=3)
    got, final_b, summary, _ = _killed_and_resumed(tiny_model, tmp_path, steps=6, interval=3, kill_at=5)
    assert summary["replayed_batches"] == 2 and summary["lost_batches"] == 0
    _same_training(expected, got, final_a, final_b)
