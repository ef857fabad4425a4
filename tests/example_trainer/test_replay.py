"""Replay bundles: a 30-step run recorded against a real run-api, verified and re-driven from its bundles."""

import json
import shutil
import subprocess
import sys

import pytest

from example_trainer.bundles import (
    check_advantages,
    list_steps,
    prune_bundles,
    read_bundle,
    write_bundle,
)
from example_trainer.config import TrainerConfig
from example_trainer.replay_cli import main
from tests.example_trainer.test_exactly_once import _killed_and_resumed
from tests.example_trainer.test_grpo_loop import _group, make_tiny_model, tiny_model, train_on  # noqa: F401
from tests.fixtures.api_server import start_run_api

STEPS = 30


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory, bundled_model_dir):
    """A 30-step GRPO run (batch of 8, tiny Llama, one thread) that kept every bundle."""
    root = tmp_path_factory.mktemp("replay")
    model = make_tiny_model(root / "tiny")
    api = start_run_api()
    try:
        config = TrainerConfig(
            model=str(model), run_dir=str(root / "run"), api_url=api.url,
            vllm_url="http://127.0.0.1:9/v1", weight_sync="none", training_steps=STEPS,
            batch_size=8, micro_batch_size=4, lr=1e-2, warmup_steps=3, lr_scheduler_type="cosine",
            batch_timeout=60, checkpoint_interval=10, checkpoint_keep=2, torch_threads=1,
            plot_every=0, replay_bundles=0, max_staleness=100)
        result, _ = train_on(config, api.url, [_group(seed) for seed in range(2 * STEPS)])
    finally:
        api.stop()
    assert result["steps"] == STEPS
    return root / "run"


def _copy(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def _replay_cli(*args):
    return subprocess.run([sys.executable, "-m", "example_trainer.replay_cli", *args],
                          capture_output=True, text=True, timeout=300)


def _recorded_losses(run):
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if "loss" in x]


def test_every_step_left_a_checksummed_bundle(recorded_run):
    assert list_steps(recorded_run) == list(range(1, STEPS + 1))
    bundle = read_bundle(recorded_run, 7)
    assert len(bundle.header["batch"]) == 2 and bundle.header["torch_threads"] == 1
    assert bundle.loss == _recorded_losses(recorded_run)[6]
    assert bundle.tensors["advantages"].shape[0] == 8 * 11  # 8 sequences of 11 targets
    # the checksum file is sha256sum's format: standard tools check it
    check = subprocess.run(["sha256sum", "-c", "step_000007.safetensors.sha256"],
                           cwd=recorded_run / "bundles", capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_verify_all_passes(recorded_run, capsys):
    assert main(["verify", str(recorded_run), "--all"]) == 0
    out = capsys.readouterr().out
    assert "re-driving steps 1..30 from the starting model" in out
    assert f"verify: {STEPS} step(s) re-driven, every stage holds" in out


def test_verify_one_step_starts_from_the_nearest_checkpoint_before_it(recorded_run, capsys):
    assert main(["verify", str(recorded_run), "--step", "25"]) == 0
    out = capsys.readouterr().out
    assert "re-driving steps 21..25 from checkpoint step 20" in out


def test_replay_train_reproduces_the_loss_trace_exactly(recorded_run, tmp_path):
    # in a process of its own (the recording ran in this one), as `atropos-replay train` runs
    out = tmp_path / "trace.jsonl"
    proc = _replay_cli("train", str(recorded_run), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    replayed = [json.loads(x)["loss"] for x in out.read_text().splitlines()]
    assert len(replayed) == STEPS and len(set(replayed)) > 1
    assert replayed == _recorded_losses(recorded_run)  # bit for bit, every step
    assert "30 steps, loss trace identical to the recording" in proc.stdout


def test_a_flipped_byte_fails_verify_at_the_bundle_checksum(recorded_run, tmp_path):
    run = _copy(recorded_run, tmp_path)
    path = run / "bundles" / "step_000007.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    proc = _replay_cli("verify", str(run), "--all")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "verify: step 7: bundle checksum diverges" in proc.stdout


def test_a_changed_advantage_with_a_valid_checksum_fails_verify_at_advantages(recorded_run, tmp_path, capsys):
    run = _copy(recorded_run, tmp_path)
    bundle = read_bundle(run, 12)
    bundle.tensors["advantages"][3] += 0.5
    write_bundle(run, 12, bundle.header, bundle.tensors)  # a fresh, matching checksum
    assert main(["verify", str(run), "--step", "12"]) == 1
    out = capsys.readouterr().out
    assert "verify: step 12: advantages diverges: advantages[3] (sequence 0)" in out


def test_a_changed_loss_fails_verify_at_loss(recorded_run, tmp_path, capsys):
    run = _copy(recorded_run, tmp_path)
    bundle = read_bundle(run, 23)
    bundle.header["metrics"]["loss"] += 1e-6
    write_bundle(run, 23, bundle.header, bundle.tensors)
    assert main(["verify", str(run), "--step", "23"]) == 1
    assert "verify: step 23: loss diverges" in capsys.readouterr().out


def test_retention_keeps_the_newest_k_and_verify_starts_at_a_kept_checkpoint(recorded_run, tmp_path, capsys):
    run = _copy(recorded_run, tmp_path)
    assert prune_bundles(run, STEPS, 12) == list(range(1, 19))
    assert list_steps(run) == list(range(19, STEPS + 1))
    assert main(["verify", str(run)]) == 0
    out = capsys.readouterr().out
    assert "steps 19..20: bundle checksum and advantages hold; not re-driven" in out
    assert "re-driving steps 21..30 from checkpoint step 20" in out
    # a step whose bundles no kept checkpoint precedes cannot be re-driven: exit 2, with the fix
    assert main(["verify", str(run), "--step", "19"]) == 2
    assert "--replay-bundles" in capsys.readouterr().err


def test_a_step_without_an_update_verifies_as_a_bundle_with_no_tensors(recorded_run, tmp_path, capsys):
    # what the trainer writes when the batch checks refuse every group (or a batch was lost)
    run = _copy(recorded_run, tmp_path)
    header = {**read_bundle(run, STEPS).header, "batch": [], "dropped": [], "skipped": True,
              "metrics": None}
    write_bundle(run, STEPS + 1, header, {})
    bundle = read_bundle(run, STEPS + 1)
    assert bundle.skipped and bundle.loss is None
    check_advantages(bundle)  # nothing computed, nothing to differ
    assert main(["verify", str(run), "--step", str(STEPS + 1)]) == 0
    assert f"verify: step {STEPS + 1}: ok" in capsys.readouterr().out


def test_a_run_killed_and_resumed_verifies_across_the_resume(tiny_model, tmp_path, capsys):  # noqa: F811
    """SIGKILL after run-api served batch 5 (checkpoint at 3), then --resume: the resumed trainer
    trains steps 4 and 5 again and rewrites their bundles; every step re-drives as recorded."""
    _killed_and_resumed(tiny_model, tmp_path, steps=6, interval=3, kill_at=5)
    run = tmp_path / "b"
    assert list_steps(run) == list(range(1, 7))
    assert main(["verify", str(run), "--all"]) == 0
    assert "verify: 6 step(s) re-driven, every stage holds" in capsys.readouterr().out
    assert main(["verify", str(run), "--step", "5"]) == 0
    assert "re-driving steps 4..5 from checkpoint step 3" in capsys.readouterr().out


def test_verify_compares_the_weights_with_the_checkpoint_of_the_same_step(recorded_run, tmp_path, capsys):
    """The weights stage holds every trainable tensor against checkpoints/step_20 (verify --all
    re-drives 1..30 from the starting model), so a changed checkpoint tensor fails it there."""
    from safetensors.torch import load_file, save_file

    run = _copy(recorded_run, tmp_path)
    [weights] = sorted((run / "checkpoints" / "step_20").glob("*.safetensors"))
    state = load_file(str(weights))
    name = next(k for k in state if "layers.1." in k and k.endswith("weight") and state[k].dim() == 2)
    state[name][0, 0] += 1.0
    save_file(state, str(weights), metadata={"format": "pt"})
    assert main(["verify", str(run), "--all"]) == 1
    out = capsys.readouterr().out
    assert f"verify: step 20: weights diverges: model.{name.removeprefix('model.')}" in out
    assert "differs from the checkpoint" in out and "step 19: ok" in out
