"""--resume after a SIGKILL, and LoRA training, against a real run-api with a tiny random Llama."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from atroposlib.api.client import AtroposClient
from example_trainer.checkpoint import ResumeError, find_latest
from example_trainer.config import TrainerConfig
from example_trainer.grpo import train
from tests.example_trainer.test_grpo_loop import _group, _load_state, needs_tokenizer, tiny_model  # noqa: F401
from tests.fixtures.api_server import start_run_api

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["--vllm-url", "http://127.0.0.1:9/v1", "--weight-sync", "none", "--training-steps", "4",
         "--batch-size", "8", "--micro-batch-size", "4", "--lr", "1e-3", "--batch-timeout", "120",
         "--checkpoint-interval", "2", "--torch-threads", "1"]


def _wait(predicate, what, timeout=180.0, proc=None):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc is None or proc.poll() is None, f"trainer exited ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _trainer(*args, log):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "example_trainer.grpo", *args], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _losses(run):
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return lines, {x["step"]: x["loss"] for x in lines if "loss" in x}


@needs_tokenizer
def test_sigkilled_run_resumes_and_matches_an_uninterrupted_one(tiny_model, tmp_path):  # noqa: F811
    # the uninterrupted run: 4 steps on groups 0..7 (two groups per batch)
    api = start_run_api()
    try:
        with (tmp_path / "a.log").open("wb") as log:
            proc = _trainer("--model", str(tiny_model), "--run-dir", str(tmp_path / "a"),
                            "--api-url", api.url, *FLAGS, log=log)
            with AtroposClient(api.url) as client:
                for seed in range(8):
                    client.post_scored_data(_group(seed))
            assert proc.wait(300) == 0, (tmp_path / "a.log").read_text()[-3000:]
    finally:
        api.stop()

    # the same run, SIGKILLed while waiting for batch 3 (after its step-2 checkpoint), resumed
    api = start_run_api()
    run = tmp_path / "b"
    try:
        with (tmp_path / "b.log").open("wb") as log, AtroposClient(api.url) as client:
            proc = _trainer("--model", str(tiny_model), "--run-dir", str(run), "--api-url", api.url,
                            *FLAGS, log=log)
            for seed in range(4):
                client.post_scored_data(_group(seed))
            _wait(lambda: (run / "checkpoints" / "step_2" / "checkpoint.json").exists()
                  and client.status()["current_step"] == 2, "the step-2 checkpoint", proc=proc)
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            # a save cut short by a kill leaves a hidden directory that resume must ignore
            (run / "checkpoints" / ".step_4.tmp-1").mkdir()
            (run / "checkpoints" / ".step_4.tmp-1" / "training_state.pt").write_bytes(b"cut sh")
            assert find_latest(run).step == 2

            proc = _trainer("--resume", str(run), "--model", str(tiny_model), "--api-url", api.url,
                            *FLAGS, log=log)
            for seed in range(4, 8):
                client.post_scored_data(_group(seed))
            assert proc.wait(300) == 0, (tmp_path / "b.log").read_text()[-3000:]
            assert client.status()["current_step"] == 4  # run-api's step continued from 2
    finally:
        api.stop()

    _, expected = _losses(tmp_path / "a")
    lines, got = _losses(run)
    assert sorted(expected) == [1, 2, 3, 4]
    # appended, not truncated: the first process's steps, the resume marker, the resumed steps
    assert [x["step"] for x in lines if "loss" in x] == [1, 2, 3, 4]
    assert {"event": "resume", "step": 2} in lines
    for step in (1, 2, 3, 4):
        assert got[step] == pytest.approx(expected[step], rel=1e-4, abs=1e-6)
    final_a, final_b = _load_state(tmp_path / "a/checkpoints/final"), _load_state(run / "checkpoints/final")
    start = _load_state(tiny_model)
    assert any(not torch.allclose(start[k], final_a[k], atol=1e-4) for k in start)
    for key in final_a:
        torch.testing.assert_close(final_b[key], final_a[key], atol=2e-6, rtol=1e-5)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4


def test_resume_without_a_checkpoint_fails_at_start_up_with_the_fix(tmp_path):
    # --model does not exist: the error must come before any model is loaded
    with pytest.raises(ResumeError, match="no such directory"):
        train(TrainerConfig(resume=str(tmp_path / "nope"), model=str(tmp_path / "no-model")))
    (tmp_path / "checkpoints" / "step_2").mkdir(parents=True)  # an old-style weights-only dir
    (tmp_path / "checkpoints" / ".step_4.tmp-7").mkdir()
    with pytest.raises(ResumeError, match="no complete checkpoint.*--checkpoint-interval"):
        train(TrainerConfig(resume=str(tmp_path), model=str(tmp_path / "no-model")))


def test_lora_and_resume_flags_are_checked():
    with pytest.raises(ValueError, match="weight_sync=lora needs a LoRA run"):
        TrainerConfig(weight_sync="lora")
    with pytest.raises(ValueError, match="drop --run-dir"):
        TrainerConfig(resume="runs/a", run_dir="runs/b")
    assert TrainerConfig(lora_r=8, weight_sync="lora", vllm_url="http://x/v1").lora_target_modules[0] == "q_proj"


def _run_in_thread(config, api, seeds):
    result = {}
    thread = threading.Thread(target=lambda: result.update(train(config)))
    thread.start()
    with AtroposClient(api.url) as client:
        for seed in seeds:
            client.post_scored_data(_group(seed))
        thread.join(300)
    assert not thread.is_alive()
    return result


@needs_tokenizer
def test_lora_trains_only_the_adapter_saves_it_and_resumes_it(tiny_model, run_api, tmp_path):  # noqa: F811
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from example_trainer.lora import apply_lora, load_adapter

    run = tmp_path / "run"
    common = dict(model=str(tiny_model), api_url=run_api.url, vllm_url="http://127.0.0.1:9/v1",
                  weight_sync="none", batch_size=8, micro_batch_size=4, lr=1e-2, batch_timeout=60,
                  checkpoint_interval=1, lora_r=4, lora_alpha=8, train_last_layers=2)
    result = _run_in_thread(TrainerConfig(run_dir=str(run), training_steps=2, **common), run_api, range(4))
    assert result["steps"] == 2
    adapter = run / "checkpoints" / "step_1" / "adapter"
    assert (adapter / "adapter_model.safetensors").exists()
    assert not (run / "checkpoints" / "step_1" / "model.safetensors").exists()  # adapter only
    # train_last_layers composes: adapters only on the last 2 of 3 layers
    keys = set(_load_adapter_state(run / "checkpoints/step_2/adapter"))
    assert keys and all(".layers.1." in k or ".layers.2." in k for k in keys)
    assert all("lora_" in k for k in keys)
    # the final checkpoint also has the merged model: same keys as the base, loadable by transformers
    base, merged = _load_state(tiny_model), _load_state(run / "checkpoints" / "final")
    assert set(merged) == set(base)
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed and all(".layers.1." in k or ".layers.2." in k for k in changed)
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model),
                                          run / "checkpoints" / "final" / "adapter").merge_and_unload()
    for key, value in reference.state_dict().items():
        if key in merged:
            torch.testing.assert_close(merged[key], value)

    # the adapter loads back exactly
    model = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model), r=4, alpha=8, dropout=0.0,
                       target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                       "up_proj", "down_proj"], last_layers=2)
    load_adapter(model, adapter)
    saved = _load_adapter_state(adapter)
    state = model.state_dict()
    for key, value in saved.items():
        torch.testing.assert_close(state[key.replace(".weight", ".default.weight")], value)

    # resume the LoRA run for one more step: run-api continues at step 2
    result = _run_in_thread(TrainerConfig(resume=str(run), training_steps=3, **common), run_api, range(4, 6))
    assert result["steps"] == 3
    with AtroposClient(run_api.url) as client:
        assert client.status()["current_step"] == 3
    step3 = _load_adapter_state(run / "checkpoints/step_3/adapter")
    step2 = _load_adapter_state(run / "checkpoints/step_2/adapter")
    assert any(not torch.equal(step2[k], step3[k]) for k in step2)


def _load_adapter_state(directory):
    from safetensors.torch import load_file

    return load_file(str(Path(directory) / "adapter_model.safetensors"))
