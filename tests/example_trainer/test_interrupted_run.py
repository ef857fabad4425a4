"""summary.json tells the truth when a run is stopped, interrupted or fails part way."""

import json
import os
import signal

import pytest

from atroposlib.api.client import AtroposClient
from example_trainer import grpo
from example_trainer.config import TrainerConfig
from tests.example_trainer.test_grpo_loop import _group, needs_tokenizer, tiny_model  # noqa: F401

# how each ending is provoked while the trainer waits for the batch of step 2, and what it raises
ENDINGS = {
    "stop_requested": None,  # one SIGINT (Ctrl-C): the trainer's handler finishes the run early
    "interrupted": KeyboardInterrupt,  # what a second Ctrl-C raises
    "error": TimeoutError,  # no batch within --batch-timeout
}


@needs_tokenizer
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_run_ended_after_one_step_says_how_and_what_it_saved(tiny_model, run_api, tmp_path,  # noqa: F811
                                                               monkeypatch, ending):
    with AtroposClient(run_api.url) as client:
        for seed in range(2):  # one batch of 8 sequences: step 1 trains, step 2 never gets a batch
            client.post_scored_data(_group(seed))
    real_wait = grpo.wait_for_batch
    calls = []

    def wait_for_batch(client, timeout, stop, **waiting):
        calls.append(timeout)
        if len(calls) == 2 and ending == "stop_requested":
            os.kill(os.getpid(), signal.SIGINT)  # delivered to the handler train() installed
        if len(calls) == 2 and ending == "interrupted":
            raise KeyboardInterrupt
        return real_wait(client, timeout, stop, **waiting)

    monkeypatch.setattr(grpo, "wait_for_batch", wait_for_batch)
    run = tmp_path / "run"
    config = TrainerConfig(
        model=str(tiny_model), run_dir=str(run), api_url=run_api.url, vllm_url="http://127.0.0.1:9/v1",
        weight_sync="none", training_steps=3, batch_size=8, micro_batch_size=8, checkpoint_interval=1,
        batch_timeout=1 if ending == "error" else 60)
    sigint_before = signal.getsignal(signal.SIGINT)
    if ENDINGS[ending] is None:
        grpo.train(config)
    else:
        with pytest.raises(ENDINGS[ending]):
            grpo.train(config)
    assert signal.getsignal(signal.SIGINT) is sigint_before  # Ctrl-C works as before again
    assert len(calls) == 2
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["stopped"] == ending
    # atropos-grpo's exit status: 130 after Ctrl-C, like atropos-launch and the env CLI; 1 otherwise
    expected = (signal.SIGINT, 128 + signal.SIGINT) if ending == "stop_requested" else (None, 1)
    assert (summary["stop_signal"], grpo.exit_code(summary, config.training_steps)) == expected
    assert summary["stopped_by_time_budget"] is False
    # the loop ran one step before it ended: its time is counted up to the interruption
    assert 0 < summary["train_loop_seconds"] <= summary["wall_seconds"]
    final = run / "checkpoints" / "final"
    if ending == "stop_requested":  # a requested stop still saves the final checkpoint
        assert summary["final_checkpoint"] == summary["last_checkpoint"] == str(final)
        assert (final / "model.safetensors").exists() and summary["error"] is None
    else:
        assert summary["final_checkpoint"] is None and not final.exists()
        assert summary["last_checkpoint"] == str(run / "checkpoints" / "step_1")
        assert summary["error"].startswith(ENDINGS[ending].__name__)


@needs_tokenizer
@pytest.mark.parametrize("ending", ["error", "interrupted", "sigterm"])
def test_an_ending_inside_a_step_keeps_every_finished_step(tiny_model, run_api, tmp_path,  # noqa: F811
                                                           monkeypatch, ending):
    """No interval checkpoint: whatever ends step 2 (an exception in its forward, a second Ctrl-C,
    a SIGTERM), the trainer leaves a checkpoint of every step it finished."""
    from example_trainer import loss

    with AtroposClient(run_api.url) as client:
        for seed in range(6):
            client.post_scored_data(_group(seed))
    real_loss = loss.grpo_loss
    calls = []

    def grpo_loss(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # step 2 (one micro-batch a step)
            if ending == "error":
                raise RuntimeError("boom in the forward")
            if ending == "interrupted":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)  # the handler: finish this step, then stop
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(loss, "grpo_loss", grpo_loss)
    run = tmp_path / "run"
    config = TrainerConfig(
        model=str(tiny_model), run_dir=str(run), api_url=run_api.url, vllm_url="http://127.0.0.1:9/v1",
        weight_sync="none", training_steps=3, batch_size=8, micro_batch_size=8, checkpoint_interval=0,
        batch_timeout=60)
    if ending == "sigterm":
        grpo.train(config)
    else:
        with pytest.raises({"error": RuntimeError, "interrupted": KeyboardInterrupt}[ending]):
            grpo.train(config)
    summary = json.loads((run / "summary.json").read_text())
    checkpoints = run / "checkpoints"
    if ending == "sigterm":  # the step in flight finishes, then the final checkpoint
        assert summary["stopped"] == "stop_requested" and summary["steps"] == 2
        assert summary["last_checkpoint"] == str(checkpoints / "final")
        assert json.loads((checkpoints / "final" / "checkpoint.json").read_text())["step"] == 2
    else:  # step 2 never finished: step 1 is saved on the way out
        assert summary["stopped"] == ending and summary["steps"] == 1
        assert summary["last_checkpoint"] == str(checkpoints / "step_1")
        assert json.loads((checkpoints / "step_1" / "checkpoint.json").read_text())["step"] == 1
        assert summary["failed_part"] == ("trainer" if ending == "error" else None)


@needs_tokenizer
def test_checkpoints_by_default_every_10_steps_keeping_the_newest_two(tiny_model, run_api, tmp_path):  # noqa: F811
    with AtroposClient(run_api.url) as client:
        for seed in range(2 * 31):
            client.post_scored_data(_group(seed % 8))
    run = tmp_path / "run"
    summary = grpo.train(TrainerConfig(
        model=str(tiny_model), run_dir=str(run), api_url=run_api.url, vllm_url="http://127.0.0.1:9/v1",
        weight_sync="none", training_steps=31, batch_size=8, micro_batch_size=8, batch_timeout=60,
        torch_threads=1))
    assert summary["steps"] == 31
    # step_10 was written, then deleted once step_30 was complete
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["final", "step_20", "step_30"]
