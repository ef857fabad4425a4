"""End to end with real vLLM serving the bundled SmolLM2 (marked e2e; short generations)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.api.models import ScoredData
from atroposlib.env_runtime.checks import check_env
from atroposlib.inference.clients.config import APIServerConfig
from atroposlib.inference.clients.openai_client import OpenAIServer
from tests.fixtures.sample_envs import ArithmeticEnv, ChatLengthEnv

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


async def test_check_env_with_real_vllm_chat_completions(vllm_server):
    server = OpenAIServer(APIServerConfig(base_url=vllm_server.base_url, api_key="x",
                                          model_name=vllm_server.model_name))
    groups = await check_env(ChatLengthEnv, server=server,
                             config_overrides={"tokenizer_name": str(vllm_server.model_dir)})
    group = groups[0]
    assert len(group["tokens"]) == 4
    assert all(m["content"] for m in (chat[-1] for chat in group["messages"]))
    assert server.config.n_kwarg_is_ignored is False  # vLLM honours n: one request per group


def test_process_cli_with_real_vllm_writes_jsonl_and_html(vllm_server, tmp_path):
    out = tmp_path / "groups.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fixtures.sample_envs", "ChatLengthEnv", "process",
         "--openai.base_url", vllm_server.base_url, "--openai.model_name", vllm_server.model_name,
         "--env.tokenizer_name", str(vllm_server.model_dir), "--env.total_steps", "2",
         "--env.data_path_to_save_groups", str(out)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = [ScoredData.model_validate_json(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2 and all(len(g.tokens) == 4 for g in groups)
    page = out.with_suffix(".html").read_text()
    assert "Question number 1?" in page


@pytest.mark.skipif(
    importlib.util.find_spec("atroposlib.inference.clients.vllm_client") is None,
    reason="VLLMServer backend not available yet",
)
async def test_managed_groups_from_real_vllm_have_aligned_sampler_logprobs(vllm_server):
    from atroposlib.inference.clients.vllm_client import VLLMServer

    server = VLLMServer(APIServerConfig(base_url=vllm_server.base_url, api_key="x",
                                        model_name=vllm_server.model_name, server_type="vllm",
                                        tokenizer_name=str(vllm_server.model_dir)))
    groups = await check_env(ArithmeticEnv, server=server,
                             config_overrides={"tokenizer_name": str(vllm_server.model_dir),
                                               "max_tokens": 8})
    group = groups[0]
    for tokens, masks, logprobs in zip(group["tokens"], group["masks"], group["inference_logprobs"],
                                       strict=True):
        generated = [i for i, m in enumerate(masks) if m != -100]
        assert 1 <= len(generated) <= 8
        assert all(logprobs[i] <= 0 for i in generated)
        assert all(logprobs[i] == 1.0 for i in range(len(tokens)) if masks[i] == -100)


def test_serve_managed_env_with_real_vllm_delivers_aligned_logprobs(vllm_server, tmp_path):
    """collect_trajectory + default aggregation, served as a subprocess, real vLLM and run-api."""
    from tests.env_runtime.test_serve import _register_trainer, _stop
    from tests.fixtures.api_server import pull_batches, start_run_api

    api = start_run_api()
    log = tmp_path / "env.log"
    try:
        trainer = _register_trainer(api.url, tmp_path, batch_size=8)
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fixtures.sample_envs", "SingleRolloutEnv", "serve",
             "--openai.server_type", "vllm", "--openai.base_url", vllm_server.base_url,
             "--openai.model_name", vllm_server.model_name,
             "--env.tokenizer_name", str(vllm_server.model_dir), "--env.group_size", "4",
             "--env.rollout_server_url", api.url, "--env.use_wandb", "false"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log.open("wb"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            batches = pull_batches(trainer, 1, timeout=420)
        finally:
            output = _stop(proc, log)
        assert len(batches) == 1, output[-3000:]
        assert proc.returncode == 0, output[-3000:]
        for group in batches[0]:
            assert len(group["tokens"]) == 4
            for tokens, masks, logprobs in zip(group["tokens"], group["masks"],
                                               group["inference_logprobs"], strict=True):
                assert len(tokens) == len(masks) == len(logprobs)
                for tok, mask, lp in zip(tokens, masks, logprobs, strict=True):
                    assert (mask == -100 and lp == 1.0) or (mask == tok and lp <= 0)
    finally:
        api.stop()


async def test_answer_logprob_is_the_policys_log_probability_of_the_reference_reply(vllm_server):
    """The difficulty screen's signal, from real vLLM, equals transformers' log-prob of the same tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    from atroposlib.environments.arithmetic_server import ArithmeticEnv as Arithmetic
    from atroposlib.environments.arithmetic_server import ArithmeticEnvConfig
    from atroposlib.envs.single_turn import _reply_tokens

    config = ArithmeticEnvConfig(tokenizer_name=str(vllm_server.model_dir), use_wandb=False)
    env = Arithmetic(config, [APIServerConfig(
        server_type="vllm", base_url=vllm_server.base_url, model_name=vllm_server.model_name,
        tokenizer_name=str(vllm_server.model_dir), api_key="x")])
    easy = {"a": 2, "op": "+", "b": 3, "answer": 5, "question": "What is 2 + 3? Answer with just the number."}
    hard = {"a": 87, "op": "-", "b": 49, "answer": 38,
            "question": "What is 87 - 49? Answer with just the number."}
    model = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, torch_dtype=torch.float32)
    signals = {}
    for name, item in (("easy", easy), ("hard", hard)):
        signal = await env.answer_logprob(item)
        prompt_ids, reply_ids, answer_start = _reply_tokens(
            env.tokenizer, env.prompt(item), *env.reference_reply(item))
        ids = torch.tensor([prompt_ids + reply_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
        targets = ids[0, 1:]
        # the answer's tokens and the end of turn, after the prompt and the working ("2 + 3 =")
        first = len(prompt_ids) + answer_start - 1
        expected = logprobs[torch.arange(len(targets)), targets][first:].sum().item()
        assert signal == pytest.approx(expected, abs=0.05), name
        assert answer_start == len(env.tokenizer.encode(env.reference_reply(item)[0])) and signal < 0
        signals[name] = signal
    assert signals["easy"] > signals["hard"]  # the bundled model says 2 + 3 = 5 far more readily
    await env.server.aclose()
