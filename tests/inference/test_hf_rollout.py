"""The trainer's in-process sampler (rollout_engine hf): real model, real uvicorn on 127.0.0.1, our own clients."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from atroposlib.inference.hf_rollout.turns import Turns


def test_a_waiting_training_step_goes_before_queued_sampling():
    turns, order, step_done = Turns(), [], threading.Event()

    def train():
        with turns.training():
            order.append("train")
            step_done.wait(5)

    def sample():
        with turns.sampling():
            order.append("sample")

    with turns.sampling():  # a generation in progress
        trainer = threading.Thread(target=train)
        trainer.start()
        time.sleep(0.1)
        sampler = threading.Thread(target=sample)
        sampler.start()
        time.sleep(0.1)
        assert order == []  # both wait for the generation in progress
    time.sleep(0.2)
    assert order == ["train"]  # the queued generation waits for the training step
    step_done.set()
    trainer.join(5)
    sampler.join(5)
    assert order == ["train", "sample"]


@pytest.fixture(scope="module")
def served(bundled_model_dir):
    """The bundled model behind the in-process sampler, in train mode with gradient checkpointing."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from atroposlib.inference.hf_rollout.engine import HFRollout
    from atroposlib.inference.hf_rollout.factory import create_app
    from atroposlib.inference.hf_rollout.server import InProcessServer

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir)
    model = AutoModelForCausalLM.from_pretrained(bundled_model_dir, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.gradient_checkpointing_enable()
    model.train()
    engine = HFRollout(model, tokenizer, model_name="smollm2", max_model_len=256, version=3)
    server = InProcessServer(create_app(engine))
    server.start()
    yield engine, server
    server.stop()


def _forward_logprobs(engine, prompt: list[int], tokens: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + tokens])).logits.float()
    lp = torch.log_softmax(logits, -1)[0, len(prompt) - 1:-1]
    return lp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1).tolist()


def test_the_env_client_gets_tokens_and_logprobs_of_the_live_weights(served):
    from atroposlib.inference.clients.config import APIServerConfig
    from atroposlib.inference.clients.manager import ServerManager

    engine, server = served
    manager = ServerManager([APIServerConfig(server_type="vllm", base_url=server.base_url,
                                             model_name="smollm2", health_check=False)])

    async def group():
        async with manager.managed_server(tokenizer=engine.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=[{"role": "user", "content": "What is 7 + 12?"}], n=4, max_tokens=12,
                temperature=1.0)
            return completion, managed.get_state()["nodes"]

    completion, nodes = asyncio.run(group())
    assert len(completion.choices) == len(nodes) == 4
    prompt = engine.chat_prompt([{"role": "user", "content": "What is 7 + 12?"}])
    for choice, node in zip(completion.choices, nodes, strict=True):
        assert node.tokens[:len(prompt)] == prompt
        generated = node.tokens[len(prompt):]
        assert 1 <= len(generated) <= 12
        assert choice.finish_reason == ("length" if len(generated) == 12 and generated[-1] not in
                                        engine.eos_ids else "stop")
        assert engine.tokenizer.decode(generated, skip_special_tokens=True) == choice.message.content
        sampled = [lp for lp in node.logprobs[len(prompt):]]
        assert sampled == pytest.approx(_forward_logprobs(engine, prompt, generated), abs=1e-4)
    assert engine.model.training  # put back in train mode after each generation


def test_answers_carry_the_policy_version_and_follow_set_version(served):
    engine, server = served
    body = {"model": "smollm2", "prompt": [1, 504, 3], "max_tokens": 4, "logprobs": 0,
            "return_tokens_as_token_ids": True, "n": 2}
    first = httpx.post(f"{server.base_url}/completions", json=body, timeout=60)
    assert first.status_code == 200, first.text
    assert first.headers["X-Atropos-Policy-Version"] == "3"
    choices = first.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert all(t.startswith("token_id:") for c in choices for t in c["logprobs"]["tokens"])
    with engine.turns.training():
        engine.set_version(4)
    again = httpx.post(f"{server.base_url}/completions", json=body, timeout=60)
    assert again.headers["X-Atropos-Policy-Version"] == "4"
    engine.set_version(3)


def test_sampling_has_its_own_random_stream_and_seeds_repeat(served):
    import torch

    engine, server = served
    body = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8, "n": 2}
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = httpx.post(f"{server.base_url}/completions", json=body, timeout=60).json()
    b = httpx.post(f"{server.base_url}/completions", json=body, timeout=60).json()
    assert torch.equal(torch.get_rng_state(), before)  # the trainer's generator never moved
    texts = lambda r: [c["text"] for c in r["choices"]]  # noqa: E731
    assert texts(a) != texts(b)  # the sampler's own stream moves on
    seeded = {**body, "seed": 7}
    c = httpx.post(f"{server.base_url}/completions", json=seeded, timeout=60).json()
    d = httpx.post(f"{server.base_url}/completions", json=seeded, timeout=60).json()
    assert texts(c) == texts(d)


def test_greedy_chat_matches_greedy_generate_and_cuts_stop_strings(served):
    import torch

    engine, server = served
    messages = [{"role": "user", "content": "What is 7 + 12? Answer with just the number."}]
    r = httpx.post(f"{server.base_url}/chat/completions", timeout=60, json={
        "model": "smollm2", "messages": messages, "max_tokens": 10, "temperature": 0, "n": 2,
        "logprobs": True})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert choices[0]["message"] == choices[1]["message"]
    prompt = engine.chat_prompt(messages)
    engine.model.eval()  # in train mode gradient checkpointing drops the KV cache and generate degrades
    try:
        with torch.no_grad():
            ids = engine.model.generate(torch.tensor([prompt]), max_new_tokens=10,
                                        do_sample=False)[0, len(prompt):].tolist()
    finally:
        engine.model.train()
    assert choices[0]["message"]["content"] == engine.tokenizer.decode(
        [t for t in ids if t not in engine.eos_ids], skip_special_tokens=True)
    assert len(choices[0]["logprobs"]["content"]) == len(
        ids[:ids.index(engine.eos_ids[0]) + 1] if engine.eos_ids[0] in ids else ids)
    text = choices[0]["message"]["content"]
    stop = text.strip()[-1]
    cut = httpx.post(f"{server.base_url}/chat/completions", timeout=60, json={
        "model": "smollm2", "messages": messages, "max_tokens": 10, "temperature": 0,
        "stop": [stop]}).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
    assert cut["message"]["content"] == text[:text.find(stop)]


@pytest.mark.parametrize(("body", "status", "says"), [
    ({"prompt": "hi", "presence_penalty": 0.5}, 400, "presence_penalty=0.5: not supported"),
    ({"prompt": "hi", "max_tokens": 300}, 400, "maximum context length is 256"),
    ({"prompt": "hi", "n": 0}, 400, "n:"),
    ({"prompt": [], "max_tokens": 2}, 400, "prompt"),
    ({"prompt": "hi", "model": "gpt-4"}, 404, "`gpt-4` does not exist"),
    ({"prompt": [[1, 2], [3, 10**9]], "max_tokens": 2}, 400, "token ids [1000000000] are outside"),
])
def test_bad_requests_get_a_4xx_that_says_what_to_change(served, body, status, says):
    _, server = served
    r = httpx.post(f"{server.base_url}/completions", json=body, timeout=60)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["message"]


def test_health_answers_while_a_training_step_holds_the_weights(served):
    engine, server = served
    root = server.base_url.removesuffix("/v1")
    result = {}
    with engine.turns.training():
        waiting = threading.Thread(target=lambda: result.update(r=httpx.post(
            f"{server.base_url}/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=60)))
        waiting.start()
        time.sleep(0.5)
        assert httpx.get(f"{root}/health", timeout=5).status_code == 200
        assert waiting.is_alive()  # no generation during the step
    waiting.join(60)
    assert result["r"].status_code == 200
    models = httpx.get(f"{server.base_url}/models", timeout=5).json()
    assert models["data"][0]["id"] == "smollm2"


def test_requests_that_wait_together_run_in_one_generate_call(served, monkeypatch):
    from atroposlib.inference.hf_rollout import engine as engine_module

    engine, server = served
    calls = []
    real = engine_module.sample_batch
    monkeypatch.setattr(engine_module, "sample_batch",
                        lambda model, tok, prompts, params, eos: calls.append(len(prompts)) or
                        real(model, tok, prompts, params, eos))
    answers: dict[int, httpx.Response] = {}

    def ask(i: int, max_tokens: int) -> None:
        answers[i] = httpx.post(f"{server.base_url}/completions", timeout=60, json={
            "prompt": f"Count to {i}:", "max_tokens": max_tokens, "n": 2, "logprobs": 0,
            "return_tokens_as_token_ids": True})

    def ask_greedy_twice() -> None:  # one request, two prompts
        answers[-1] = httpx.post(f"{server.base_url}/completions", timeout=60, json={
            "prompt": [[1, 504], [1, 505, 506]], "max_tokens": 3, "n": 2, "temperature": 0})

    with engine.turns.training():  # the requests queue up behind a training step
        threads = [threading.Thread(target=ask, args=(i, 3 + i)) for i in range(3)]
        threads.append(threading.Thread(target=ask_greedy_twice))
        for t in threads:
            t.start()
        time.sleep(2.0)
    for t in threads:
        t.join(60)
    # the three sampled requests in one call; the greedy one's two prompts in another
    assert sorted(calls) == [2, 3]
    several = answers.pop(-1)
    assert several.status_code == 200, several.text
    assert [c["index"] for c in several.json()["choices"]] == [0, 1, 2, 3]

    for i, r in answers.items():
        assert r.status_code == 200, r.text
        for choice in r.json()["choices"]:
            tokens = choice["logprobs"]["tokens"]
            assert len(tokens) <= 3 + i  # each cut to its own max_tokens
            assert choice["finish_reason"] == ("length" if len(tokens) == 3 + i else "stop")
