"""The trainer's main loop against a real run-api, with a tiny random Llama (no vLLM needed)."""

import json
import re
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from atroposlib.api.client import AtroposClient
from atroposlib.inference.bundled import bundled_model_dir
from atroposlib.utils.cpu_features import native_bf16
from example_trainer.config import TrainerConfig
from example_trainer.grpo import freeze_all_but_last_layers, main, train
from example_trainer.report import run_eval_command

BUNDLED = bundled_model_dir()
# The session fixture builds the bundled model when it is missing (a fresh machine), so
# these tests run there rather than skip.
needs_tokenizer = pytest.mark.usefixtures("bundled_model_dir")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, bundled_model_dir):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


def make_tiny_model(out):
    """A 3-layer Llama with the bundled tokenizer, saved as a HF directory in ``out``."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(BUNDLED)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=128, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _group(seed: int, size: int = 4) -> dict:
    g = torch.Generator().manual_seed(seed)
    tokens = [torch.randint(5, 1000, (12,), generator=g).tolist() for _ in range(size)]
    masks = [[-100] * 6 + t[6:] for t in tokens]
    lps = [[1.0] * 6 + [-0.5] * 6 for _ in tokens]
    # teacher arrays as TeacherDistillationEnv sends them: position 0 empty, 2 candidates after
    distill_ids = [[[]] + [[t[p], 7] for p in range(1, 12)] for t in tokens]
    distill_lps = [[[]] + [[-0.3, -1.5]] * 11 for _ in tokens]
    return {"tokens": tokens, "masks": masks, "scores": [1.0, 0.0, 0.5, 0.0][:size],
            "inference_logprobs": lps, "generation_params": {"temperature": 1.0},
            "distill_token_ids": distill_ids, "distill_logprobs": distill_lps}


def train_on(config, api_url: str, groups: list) -> tuple[dict, dict]:
    """Run ``train(config)`` in a thread; once it registers (batch size 8), post ``groups``.

    Returns:
        ``(train's result, run-api's /status after the trainer ended)``.
    """
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(train(config)))
    thread.start()
    with AtroposClient(api_url) as client:
        deadline = time.monotonic() + 120
        while client.info()["batch_size"] != 8:
            assert time.monotonic() < deadline and thread.is_alive(), "trainer did not register"
            time.sleep(0.2)
        for group in groups:
            client.post_scored_data(group)
        thread.join(300)
        status = client.status()
    assert not thread.is_alive(), "the trainer did not finish"
    return result, status


@needs_tokenizer
@pytest.mark.parametrize(("kl_coef", "mixed_precision"),
                         [(0.0, "no"), (0.5, "no"), (0.5, "bf16"), (0.0, "bf16_if_native")])
def test_two_steps_pull_one_batch_each_train_and_write_the_run(tiny_model, run_api, tmp_path, kl_coef,
                                                                mixed_precision, capsys):
    eval_script = tmp_path / "fake_eval.py"
    eval_script.write_text(
        "import json, sys, pathlib\n"
        "out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)\n"
        "acc = 0.25 if sys.argv[2] == '0' else 0.5\n"
        "(out / 'metrics.json').write_text(json.dumps({'results': {'all': {'eval/accuracy': acc}}}))\n")
    config = TrainerConfig(
        model=str(tiny_model), run_dir=str(tmp_path / "run"), api_url=run_api.url,
        vllm_url="http://127.0.0.1:9/v1", weight_sync="none", training_steps=2, batch_size=8,
        micro_batch_size=4, lr=1e-3, batch_timeout=60, checkpoint_interval=1, kl_coef=kl_coef,
        distill_coef=kl_coef,  # the second case also trains on the teacher arrays
        max_staleness=5,  # sent with /register; these groups carry no policy_version: all kept
        mixed_precision=mixed_precision,
        eval_command=f"{sys.executable} {eval_script} {{out_dir}} {{step}}")
    before = {k: v.clone() for k, v in _load_state(tiny_model).items()}
    # 3 batches worth; the trainer must take only 2 (one per step)
    result, status = train_on(config, run_api.url, [_group(seed) for seed in range(6)])
    assert result["steps"] == 2 and status["queue_size"] == 2
    assert status["max_staleness"] == 5 and status["stale_groups_dropped"] == {}
    assert result["eval_accuracy_before"] == 0.25 and result["eval_accuracy_after"] == 0.5
    run = tmp_path / "run"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "loss" in x]
    assert [x["step"] for x in steps] == [1, 2]
    assert all(x["sequences"] == 8 and x["trained_tokens"] == 8 * 6 for x in steps)
    assert all(x["grad_norm"] > 0 for x in steps)
    # KL to the frozen starting policy: zero before the first update, positive after it
    assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert (steps[1]["kl"] > 0) == (kl_coef > 0)
    assert all(("distill_kl" in x) == (kl_coef > 0) for x in steps)
    assert all(x["distill_kl"] > 0 for x in steps if "distill_kl" in x)
    assert (run / "plot.png").exists() and (run / "checkpoints" / "step_1" / "model.safetensors").exists()
    after = _load_state(run / "checkpoints" / "final")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["eval_seconds"] > 0  # evaluations kept off the budget
    # bf16_if_native is resolved by this CPU's flags, and the run records the value it trained with
    native = "bf16" if native_bf16() else "no"
    resolved = native if mixed_precision == "bf16_if_native" else mixed_precision
    assert json.loads((run / "trainer_config.json").read_text())["mixed_precision"] == resolved
    assert summary["stopped"] == "completed" and summary["final_checkpoint"] == str(run / "checkpoints" / "final")
    assert summary["train_loop_seconds"] > 0 and summary["error"] is None
    # the console says what the run waits for at start, then each step's progress
    out = capsys.readouterr().out
    assert re.search(r"\[grpo\] waiting for the first batch \(8 sequences\): run-api has \d+ groups? queued", out)
    # (the budget's clock starts at registration and leaves out the evaluations run since;
    # the first step's may read 0s, and then no ETA is known yet)
    assert re.search(r"\[grpo\] step 1/2 \(\d+s, ETA (\d+s|\?)\): reward/mean=", out), out
    assert re.search(r"\[grpo\] step 2/2 \(\d+s, ETA 0s\): reward/mean=", out), out


@needs_tokenizer
def test_linear_lr_schedule_warms_up_and_decays_over_the_steps(tiny_model, run_api, tmp_path):
    config = TrainerConfig(
        model=str(tiny_model), run_dir=str(tmp_path / "run"), api_url=run_api.url,
        vllm_url="http://127.0.0.1:9/v1", weight_sync="none", training_steps=4, batch_size=8,
        micro_batch_size=8, lr=1e-3, warmup_steps=2, lr_scheduler_type="linear",
        max_train_seconds=864_000, batch_timeout=60, max_staleness=5)
    result, _ = train_on(config, run_api.url, [_group(seed) for seed in range(8)])
    assert result["steps"] == 4
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # warm-up (1/2, then 1) times the linear decay (1 - steps done / 4); the 10-day budget
    # is not what ends these 4 steps (its share used is under 1e-4), so the steps set the
    # progress, and the last step still trains
    assert [x["lr"] for x in lines if "loss" in x] == pytest.approx(
        [1e-3 * 0.5, 1e-3 * 0.75, 1e-3 * 0.5, 1e-3 * 0.25], rel=1e-4)


def _load_state(directory):
    from safetensors.torch import load_file

    return load_file(str(Path(directory) / "model.safetensors"))


@needs_tokenizer
def test_freeze_all_but_last_layers(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    freeze_all_but_last_layers(model, 1)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("model.layers.2.", "model.norm")) for n in trainable)
    with pytest.raises(ValueError, match="train_last_layers=9"):
        freeze_all_but_last_layers(model, 9)


def test_eval_command_errors_are_explained(tmp_path):
    with pytest.raises(RuntimeError, match="exited with 3"):
        run_eval_command("exit 3", base_url="u", model_name="m", out_dir=tmp_path / "a", step=0,
                         metric="eval/accuracy", timeout=30, log_path=tmp_path / "eval.log")
    with pytest.raises(RuntimeError, match="wrote no"):
        run_eval_command("true", base_url="u", model_name="m", out_dir=tmp_path / "b", step=0,
                         metric="eval/accuracy", timeout=30, log_path=tmp_path / "eval.log")


def test_config_rejects_inconsistent_settings():
    with pytest.raises(ValueError, match="micro_batch_size"):
        TrainerConfig(batch_size=4, micro_batch_size=8)
    with pytest.raises(ValueError, match="restart needs the trainer to own vLLM"):
        TrainerConfig(vllm_url="http://x/v1", weight_sync="restart")


def test_help_is_fast_and_lists_flags(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--weight-sync", "--kl-coef", "--training-steps", "--eval-command"):
        assert flag in out


def test_external_vllm_that_is_down_fails_fast_with_a_fix(tmp_path):
    from atroposlib.errors import InferenceError
    from example_trainer.vllm_sync import VLLMSync

    config = TrainerConfig(vllm_url="http://127.0.0.1:9/v1", weight_sync="reload", vllm_start_timeout=2)
    with pytest.raises(InferenceError, match="no vLLM answers http://127.0.0.1:9/health"):
        VLLMSync(config, tmp_path).start()
    # nothing to sync and no eval: the trainer does not need the server at all
    assert VLLMSync(TrainerConfig(vllm_url="http://127.0.0.1:9/v1", weight_sync="none"), tmp_path).start() == 0.0
