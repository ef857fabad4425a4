"""End to end: real vLLM + bundled model + shared GSM8K -> `gsm8k_server.py process` / `evaluate`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SHARED_GSM8K = (REPO / "../shared/data/gsm8k").resolve()
ENV_SCRIPT = REPO / "environments" / "gsm8k_server.py"


def _run(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    proc = subprocess.run(
        [sys.executable, str(ENV_SCRIPT), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return proc


@pytest.fixture
def server_args(vllm_server):
    if not (SHARED_GSM8K / "train.jsonl").exists():
        pytest.skip(f"GSM8K not found at {SHARED_GSM8K}")
    return [
        "--env.dataset_name", str(SHARED_GSM8K),
        "--env.tokenizer_name", str(vllm_server.model_dir),
        "--openai.base_url", vllm_server.base_url,
        "--openai.model_name", vllm_server.model_name,
    ]  # fmt: skip


def test_process_writes_a_real_group_aligned_with_the_tokenizer(vllm_server, server_args, tmp_path):
    from transformers import AutoTokenizer

    _run(
        [
            "process",
            *server_args,
            "--env.total_steps",
            "1",
            "--env.group_size",
            "4",
            "--env.max_tokens",
            "48",
            "--env.include_messages",
            "true",
            # process mode already keeps uniform-score groups; say so explicitly (SmolLM2 is weak).
            "--env.ensure_scores_are_not_same",
            "false",
            "--env.data_path_to_save_groups",
            str(tmp_path / "out.jsonl"),
        ],  # fmt: skip
        cwd=tmp_path,
    )
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert len(lines) == 1
    group = json.loads(lines[0])
    assert (tmp_path / "out.html").stat().st_size > 0
    tok = AutoTokenizer.from_pretrained(vllm_server.model_dir)
    assert len(group["tokens"]) == len(group["scores"]) == 4
    assert all(s in (1.0, -1.0) for s in group["scores"])
    completions = set()
    for tokens, masks, logprobs, messages in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], group["messages"], strict=True
    ):
        assert messages[-1]["role"] == "assistant"
        prompt = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
        prompt_ids = tok.encode(prompt, add_special_tokens=False)
        generated = tokens[len(prompt_ids) :]
        # Prompt tokens are exactly the tokenizer's; only the completion is trained.
        assert tokens[: len(prompt_ids)] == prompt_ids
        assert masks == [-100] * len(prompt_ids) + generated
        assert 10 <= len(generated) <= 48
        # Sampler logprobs: 1.0 on the prompt, real (negative, finite) on every generated token.
        assert len(logprobs) == len(tokens)
        assert logprobs[: len(prompt_ids)] == [1.0] * len(prompt_ids)
        assert all(-50 < lp <= 0 for lp in logprobs[len(prompt_ids) :])
        assert tok.decode(generated, skip_special_tokens=True) == messages[-1]["content"]
        completions.add(tuple(generated))
    assert len(completions) > 1, "temperature-1 samples should differ"


def test_evaluate_reports_accuracy(vllm_server, server_args, tmp_path):
    out = tmp_path / "evals"
    _run(
        [
            "evaluate",
            *server_args,
            "--env.eval_limit",
            "4",
            "--env.max_tokens",
            "32",
            "--env.data_dir_to_save_evals",
            str(out),
        ],  # fmt: skip
        cwd=tmp_path,
    )
    metrics = json.loads((out / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/num_questions"] == 4
    assert 0.0 <= metrics["eval/percent_correct"] <= 1.0
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and all(s["response"] for s in samples)
