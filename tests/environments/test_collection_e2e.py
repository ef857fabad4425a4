"""Collection envs against REAL vLLM serving the bundled model (marked e2e; short generations)."""

from __future__ import annotations

import pytest

from atroposlib.api.models import IGNORE_INDEX
from atroposlib.env_runtime.checks import check_env
from atroposlib.inference.clients.config import APIServerConfig

# Our own module: an import failure is a failure of this file, not a reason to skip it.
from atroposlib.inference.clients.vllm_client import VLLMServer

pytestmark = pytest.mark.e2e


def _vllm_backend(vllm_server):
    return VLLMServer(APIServerConfig(
        model_name=vllm_server.model_name, base_url=vllm_server.base_url, api_key="x",
        server_type="vllm", timeout=120,
    ))


async def test_blackjack_multi_turn_real_vllm(vllm_server):
    from transformers import AutoTokenizer

    from atroposlib.environments.blackjack_env import BlackjackEnv

    tokenizer = AutoTokenizer.from_pretrained(str(vllm_server.model_dir))
    groups = await check_env(
        BlackjackEnv, _vllm_backend(vllm_server),
        {"tokenizer_name": str(vllm_server.model_dir), "group_size": 2, "max_turns": 3,
         "max_tokens": 16, "seed": 5},
        tokenizer=tokenizer,
    )
    group = groups[0]
    for tokens, masks, messages in zip(group["tokens"], group["masks"], group["messages"], strict=True):
        # maximal runs of trained tokens, separated by masked prompt text
        runs, current = [], []
        for token, mask in zip(tokens, masks, strict=True):
            if mask != IGNORE_INDEX:
                current.append(token)
            elif current:
                runs.append(current)
                current = []
        if current:
            runs.append(current)
        turns = [m["content"] for m in messages if m["role"] == "assistant"]
        assert 1 <= len(turns) <= 3
        # every assistant turn is trained, exactly as sampled; nothing else is
        assert [tokenizer.decode(r, skip_special_tokens=True) for r in runs] == turns
        prompt = tokenizer.decode([t for t, m in zip(tokens, masks, strict=True) if m == IGNORE_INDEX])
        assert all(m["content"] in prompt for m in messages if m["role"] == "user")
    assert all(-1.6 <= s <= 1.0 for s in group["scores"])


def test_code_execution_process_real_vllm(vllm_server, tmp_path):
    """`process` mode end to end: real vLLM writes code, the sandbox runs it, JSONL + HTML out."""
    import json

    from atroposlib.env_runtime.checks import check_group
    from atroposlib.env_runtime.command_line import run_cli
    from atroposlib.environments.code_execution_env import CodeExecutionEnv

    out = tmp_path / "code.jsonl"
    run_cli(CodeExecutionEnv, [
        "process", f"--openai.base_url={vllm_server.base_url}",
        f"--openai.model_name={vllm_server.model_name}", "--openai.server_type=vllm",
        f"--env.tokenizer_name={vllm_server.model_dir}", "--env.dataset_name=builtin",
        "--env.group_size=2", "--env.total_steps=2", "--env.max_tokens=96",
        "--env.temperature=0.7", "--env.cpu_seconds=2", "--env.wall_seconds=5",
        f"--env.data_path_to_save_groups={out}",
    ])
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2 and out.with_suffix(".html").exists()
    for group in groups:
        check_group(group, 2)
        assert set(group["scores"]) <= {-1.0, 1.0}
        assert group["inference_logprobs"] is not None
