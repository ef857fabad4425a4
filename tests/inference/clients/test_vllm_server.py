"""VLLMServer: request shape (fast, against a minimal fake of vLLM's wire format) and real vLLM (e2e)."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from fastapi import FastAPI, Request

from atroposlib.errors import InferenceError
from atroposlib.inference.clients.base import actual_token_logprob
from atroposlib.inference.clients.config import APIServerConfig
from atroposlib.inference.clients.manager import ServerManager
from atroposlib.inference.clients.vllm_client import VLLMServer, parse_token_id, root_url


def test_parse_token_id_and_root_url():
    assert parse_token_id("token_id:123") == 123
    with pytest.raises(InferenceError, match="return_tokens_as_token_ids"):
        parse_token_id("hello")
    assert root_url("http://h:1/v1") == "http://h:1"
    assert root_url("http://h:1/v1/") == "http://h:1"
    assert root_url("http://h:1") == "http://h:1"


def test_needs_a_base_url():
    with pytest.raises(ValueError, match="base_url"):
        VLLMServer(APIServerConfig(server_type="vllm", base_url=""))


def _fake_vllm(requests: list[dict], ignore_token_ids: bool = False) -> FastAPI:
    """vLLM's /v1/completions wire format: token i of choice k is 100*k + i, logprob -(i+1)/10."""
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        requests.append(body)
        choices = []
        for k in range(body.get("n", 1)):
            ids = [100 * k + i for i in range(body["max_tokens"])]
            tokens = [f"t{t}" if ignore_token_ids else f"token_id:{t}" for t in ids]
            choices.append(
                {
                    "index": k,
                    "text": "x",
                    "finish_reason": "length" if k else "stop",
                    "logprobs": {
                        "tokens": tokens,
                        "token_logprobs": [-(i + 1) / 10 for i in range(len(ids))],
                        "text_offset": [0] * len(ids),
                        "top_logprobs": None,
                    },
                    "prompt_logprobs": [None]
                    + [{str(t): {"logprob": -0.5, "rank": 1}} for t in body["prompt"][1:]],
                }
            )
        return {
            "id": "c",
            "object": "text_completion",
            "created": 0,
            "model": body["model"],
            "choices": list(reversed(choices)),  # out of order on purpose
        }

    return app


def _server_on(app: FastAPI) -> VLLMServer:
    config = APIServerConfig(
        server_type="vllm", base_url="http://fake/v1", model_name="m", api_key="k"
    )
    server = VLLMServer(config)
    transport = httpx.ASGITransport(app=app)
    server.openai = openai.AsyncOpenAI(
        base_url="http://fake/v1",
        api_key="k",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=transport),
    )
    server._http = httpx.AsyncClient(transport=transport)
    return server


async def test_tokens_and_logprobs_request_and_parsing():
    requests: list[dict] = []
    server = _server_on(_fake_vllm(requests))
    assert await server.check_health()
    prompt, outputs, logprobs, reasons = await server.tokens_and_logprobs_completion(
        input_ids=[5, 6, 7],
        prompt="ignored when input_ids given",
        n=2,
        max_new_tokens=3,
        temperature=0.7,
        top_k=20,
        stop=["\n"],
    )
    body = requests[-1]
    assert body["prompt"] == [5, 6, 7]  # token ids, not text
    assert body["logprobs"] == 0 and body["return_tokens_as_token_ids"] is True
    assert body["max_tokens"] == 3 and body["top_k"] == 20 and body["n"] == 2
    assert body["model"] == "m" and body["stop"] == ["\n"] and body["temperature"] == 0.7
    assert prompt == [5, 6, 7]
    assert outputs == [[0, 1, 2], [100, 101, 102]]  # sorted by choice index
    assert logprobs == [[-0.1, -0.2, -0.3]] * 2
    assert reasons == ["stop", "length"]
    await server.aclose()


async def test_not_a_vllm_server_is_a_clear_error():
    server = _server_on(_fake_vllm([], ignore_token_ids=True))
    with pytest.raises(InferenceError, match="token_id"):
        await server.tokens_and_logprobs_completion(input_ids=[1, 2], max_tokens=2)
    with pytest.raises(ValueError, match="input_ids"):
        await server.tokens_and_logprobs_completion(max_tokens=2)


async def test_get_logprobs_uses_prompt_logprobs():
    requests: list[dict] = []
    server = _server_on(_fake_vllm(requests))
    result = await server.get_logprobs(input_ids=[4, 8, 9], top_k=3)
    assert requests[-1]["prompt_logprobs"] == 3 and requests[-1]["max_tokens"] == 1
    assert result["prompt_tokens"] == [4, 8, 9]
    assert result["prompt_topk_token_ids"] == [[], [8], [9]]
    assert result["prompt_topk_logprobs"] == [[], [-0.5], [-0.5]]
    await server.get_logprobs(input_ids=[4, 8, 9], top_k=0)  # vLLM: only the actual token
    assert requests[-1]["prompt_logprobs"] == 0
    await server.get_logprobs(input_ids=[4, 8, 9])
    assert requests[-1]["prompt_logprobs"] == 1


async def test_actual_token_logprob_reads_the_scored_token_from_an_answer():
    server = _server_on(_fake_vllm([]))
    result = await server.get_logprobs(input_ids=[4, 8, 9], top_k=1)
    assert actual_token_logprob(result, 1, 8) == -0.5
    assert actual_token_logprob(result, 2, 8) is None  # 8 is not ranked at position 2
    assert actual_token_logprob(result, 0, 4) is None  # nothing precedes the first token
    ranked = {"prompt_topk_token_ids": [[], [3, 8]], "prompt_topk_logprobs": [[], [-0.1, -2.5]]}
    assert actual_token_logprob(ranked, 1, 8) == -2.5  # outside the top 1, added by vLLM
    with pytest.raises(IndexError):
        actual_token_logprob(result, 3, 9)


# ---------------------------------------------------------------------- real vLLM (e2e)


@pytest.fixture
def tokenizer(bundled_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_model_dir)


def _config(vllm_server, **kw) -> APIServerConfig:
    return APIServerConfig(
        server_type="vllm",
        base_url=vllm_server.base_url,
        model_name=vllm_server.model_name,
        tokenizer_name=str(vllm_server.model_dir),
        api_key="x",
        **kw,
    )


@pytest.mark.e2e
async def test_real_vllm_tokens_match_the_tokenizer_and_hf_logprobs(vllm_server, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    server = VLLMServer(_config(vllm_server))
    assert await server.check_health()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colours."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    prompt, outputs, logprobs, reasons = await server.tokens_and_logprobs_completion(
        prompt=text, n=4, max_tokens=12, temperature=1.0
    )
    assert prompt == tokenizer.encode(text)
    assert len(outputs) == len(logprobs) == len(reasons) == 4
    assert all(reason in ("stop", "length") for reason in reasons)
    model = AutoModelForCausalLM.from_pretrained(vllm_server.model_dir, dtype=torch.float32).eval()
    for out, lps, reason in zip(outputs, logprobs, reasons, strict=True):
        assert len(out) == len(lps) and 0 < len(out) <= 12
        assert (reason == "stop") == (out[-1] == tokenizer.eos_token_id)
        # Temperature 1.0 sampling log-probs are the model's log-softmax at each position.
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out])).logits[0].double()
        expected = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(
            1, torch.tensor(out)[:, None]
        )[:, 0]
        assert torch.allclose(torch.tensor(lps, dtype=torch.float64), expected, atol=2e-3)
    await server.aclose()


@pytest.mark.e2e
async def test_real_vllm_managed_server_nodes_are_aligned(vllm_server, tokenizer):
    manager = ServerManager([_config(vllm_server)])
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    async with manager.managed_server(tokenizer=tokenizer) as managed:
        completion = await managed.chat_completion(
            messages=messages, n=3, max_tokens=16, temperature=1.0
        )
        nodes = managed.get_state()["nodes"]
    prompt_ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
        prompt_ids = prompt_ids["input_ids"]
    assert len(nodes) == len(completion.choices) == 3
    for node, choice in zip(nodes, completion.choices, strict=True):
        assert len(node.tokens) == len(node.masked_tokens) == len(node.logprobs)
        assert node.tokens[: len(prompt_ids)] == list(prompt_ids)
        assert node.masked_tokens[: len(prompt_ids)] == [-100] * len(prompt_ids)
        generated = node.tokens[len(prompt_ids) :]
        assert node.masked_tokens[len(prompt_ids) :] == generated and generated
        assert all(lp <= 0 for lp in node.logprobs[len(prompt_ids) :])
        assert all(lp == 1.0 for lp in node.logprobs[: len(prompt_ids)])
        assert tokenizer.decode(generated, skip_special_tokens=True) == choice.message.content
    for server in manager.servers:
        await server.aclose()


@pytest.mark.e2e
async def test_real_vllm_chat_n_and_vllm_only_params(vllm_server):
    server = VLLMServer(_config(vllm_server))
    completion = await server.chat_completion(
        messages=[{"role": "user", "content": "Say hi."}], n=3, max_tokens=8, top_k=5, min_p=0.0
    )
    assert len(completion.choices) == 3
    results = await asyncio.gather(
        *(server.completion(prompt="1, 2, 3,", max_tokens=4, temperature=0.0) for _ in range(2))
    )
    assert results[0].choices[0].text == results[1].choices[0].text  # greedy is deterministic
    await server.aclose()


@pytest.mark.e2e
async def test_throughput_tool_measures_every_figure(vllm_server):
    from atroposlib.inference.throughput import measure

    result = await measure(
        vllm_server.base_url, vllm_server.model_name, n=4, concurrency=4, max_tokens=8, repeats=1
    )
    assert set(result) == {
        "single_tok_s",
        "n_tok_s",
        "n_speedup",
        "concurrent_tok_s",
        "concurrent_speedup",
    }
    assert all(value > 0 for value in result.values())
    assert result["n_speedup"] == pytest.approx(result["n_tok_s"] / result["single_tok_s"])
