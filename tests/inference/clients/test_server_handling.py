"""APIServer / ServerManager / OpenAIServer / ManagedServer behaviour (fake backends, real HTTP)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from tenacity import wait_none

from atroposlib.api.models import IGNORE_INDEX, MASKED_LOGPROB
from atroposlib.errors import InferenceUnavailableError
from atroposlib.inference.clients.base import AsyncSemWithAdaptiveWeight
from atroposlib.inference.clients.config import APIServerConfig, ReasoningConfig, ServerBaseline
from atroposlib.inference.clients.managed import DummyManagedServer, ManagedServer
from atroposlib.inference.clients.manager import ServerManager
from atroposlib.inference.clients.openai_client import OpenAIServer
from atroposlib.testing.fake_server import FakeOpenAIServer, FakeServer, fake_logprob

MSG = [{"role": "user", "content": "hi"}]


def _fake(**kw) -> FakeServer:
    server = FakeServer(**kw)
    server.retry_wait = wait_none()
    return server


def test_single_config_is_honoured_not_replaced_by_localhost_ports():
    manager = ServerManager(APIServerConfig(base_url="http://myhost:9001/v1", api_key="secret"))
    assert len(manager.servers) == 1
    server = manager.servers[0]
    assert isinstance(server, OpenAIServer)
    assert server.config.base_url == "http://myhost:9001/v1" and server.config.api_key == "secret"


def test_bare_baseline_synthesises_urls_and_slurm_parses_infer_tp(monkeypatch):
    manager = ServerManager(ServerBaseline(model_name="m"))
    assert [s.config.base_url for s in manager.servers] == [
        f"http://localhost:{p}/v1" for p in (9004, 9005, 9006, 9007)]
    monkeypatch.setenv("SLURM_JOB_NODELIST", "train0,infer1,infer2")
    monkeypatch.setenv("NUM_TRAINING_NODES", "1")
    monkeypatch.setenv("INFER_TP", "2")  # a string: upstream crashed with a TypeError here
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol: fall back to the comma list
    manager = ServerManager(ServerBaseline(model_name="m"))
    urls = [s.config.base_url for s in manager.servers]
    assert urls == [f"http://infer{n}:{9000 + i}/v1" for n in (1, 2) for i in range(4)]


async def test_large_n_is_split_and_merged():
    server = _fake(responses=[f"r{i}" for i in range(20)])
    manager = ServerManager([server], max_n_completions=8)
    completion = await manager.chat_completion(messages=MSG, n=20)
    assert [c.index for c in completion.choices] == list(range(20))
    assert sorted(r.n for r in server.requests) == [4, 8, 8]


async def test_least_busy_routing_and_per_server_concurrency_limit():
    config = APIServerConfig(base_url=None, health_check=False, num_max_requests_at_once=2)
    a, b = _fake(config=config, latency=0.2), _fake(config=config.model_copy(), latency=0.2)
    manager = ServerManager([a, b])
    start = time.perf_counter()
    await asyncio.gather(*(manager.chat_completion(messages=MSG, n=1) for _ in range(8)))
    elapsed = time.perf_counter() - start
    assert len(a.requests) == 4 and len(b.requests) == 4
    assert a.max_concurrency_seen == 2 and b.max_concurrency_seen == 2
    assert elapsed >= 0.4  # 8 requests / (2 servers x 2 slots) x 0.2 s


async def test_unhealthy_server_is_skipped():
    a, b = _fake(), _fake()
    a.set_healthy(False)
    manager = ServerManager([a, b])
    for _ in range(3):
        await manager.chat_completion(messages=MSG)
    assert len(a.requests) == 0 and len(b.requests) == 3


async def test_waiting_for_health_has_a_timeout():
    server = _fake(config=APIServerConfig(base_url=None, health_check=False, timeout=1))
    server.set_healthy(False)
    start = time.perf_counter()
    with pytest.raises(InferenceUnavailableError, match="stayed unhealthy"):
        await ServerManager([server]).chat_completion(messages=MSG)
    assert 0.9 <= time.perf_counter() - start < 5


async def test_transient_errors_retried_three_times_total_and_others_not_at_all():
    server = _fake()
    server.fail_next(5)
    with pytest.raises(httpx.ConnectError):
        await ServerManager([server]).chat_completion(messages=MSG)
    assert len(server.requests) == 3  # one retry layer (upstream stacked up to 9 attempts)
    server = _fake()
    server.fail_next(2)
    completion = await ServerManager([server]).chat_completion(messages=MSG)
    assert len(completion.choices) == 1 and len(server.requests) == 3
    server = _fake()
    server.fail_next(1, ValueError("bad request shape"))
    with pytest.raises(ValueError):
        await ServerManager([server]).chat_completion(messages=MSG)
    assert len(server.requests) == 1
    metrics = ServerManager([server, _fake()]).wandb_metrics()
    assert "server/server_0_failed_requests" in metrics and "server/server_1_failed_requests" in metrics


async def test_adaptive_semaphore_weight_limits_concurrency():
    sem = AsyncSemWithAdaptiveWeight(4)
    sem.update_weight(0.5)
    active = peak = 0

    async def job():
        nonlocal active, peak
        async with sem:
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.02)
            active -= 1

    await asyncio.gather(*(job() for _ in range(10)))
    assert peak == 2
    sem.update_weight(1.0)
    peak = 0
    await asyncio.gather(*(job() for _ in range(10)))
    assert peak == 4 and sem.value == 4


async def test_openai_server_over_http_health_is_get_models_and_n_fallback():
    fake = FakeServer(ignore_n=True)
    with FakeOpenAIServer(fake) as http_server:
        config = APIServerConfig(base_url=http_server.base_url, api_key="k", model_name="fake")
        manager = ServerManager(config)
        server = manager.servers[0]
        assert await server.check_health() is True
        assert fake.requests == []  # the health check sent no completion
        completion = await manager.chat_completion(messages=MSG, n=3, max_tokens=5)
        assert len(completion.choices) == 3 and [c.index for c in completion.choices] == [0, 1, 2]
        assert server.config.n_kwarg_is_ignored is True
        assert len(fake.requests) == 3  # 1 probe + 2 fan-out
        fake.requests.clear()
        await manager.chat_completion(messages=MSG, n=1)
        assert len(fake.requests) == 1  # upstream sent a second, wasted request here
        text = await manager.completion(prompt="Once", n=2)
        assert len(text.choices) == 2
        http_server.stop()
        assert await server.check_health() is False
        await manager.aclose()


async def test_managed_server_requires_token_logprobs_unless_dummy_allowed(monkeypatch):
    manager = ServerManager(APIServerConfig(base_url="http://127.0.0.1:9/v1", health_check=False))
    with pytest.raises(NotImplementedError, match="server_type 'vllm'"):
        async with manager.managed_server(tokenizer=object()):
            pass
    monkeypatch.setenv("ATROPOS_ALLOW_DUMMY_MANAGED_SERVER", "1")
    async with manager.managed_server(tokenizer=object()) as managed:
        assert isinstance(managed, DummyManagedServer)
    await manager.aclose()


async def test_managed_multi_turn_extends_nodes_and_keeps_earlier_turns_trained(tiny_tokenizer):
    server = _fake(responses=["first answer", "second answer"], tokenizer=tiny_tokenizer)
    manager = ServerManager([server])
    async with manager.managed_server(tokenizer=tiny_tokenizer) as managed:
        first = await managed.chat_completion(messages=MSG, n=1, max_tokens=50)
        node1 = managed.get_state()["nodes"][0]
        turn2 = MSG + [{"role": "assistant", "content": first.choices[0].message.content},
                       {"role": "user", "content": "more"}]
        await managed.chat_completion(messages=turn2, n=1, max_tokens=50)
        nodes = managed.get_state()["nodes"]
    assert len(nodes) == 1  # extended in place
    node2 = nodes[0]
    assert node2.tokens[: len(node1.tokens)] == node1.tokens  # exact earlier tokens reused
    assert node2.masked_tokens[: len(node1.tokens)] == node1.masked_tokens  # turn 1 still trained
    assert node2.logprobs[: len(node1.tokens)] == node1.logprobs
    trained = [t for t, m in zip(node2.tokens, node2.masked_tokens, strict=True) if m != IGNORE_INDEX]
    text = tiny_tokenizer.decode(trained)
    assert "first answer" in text and "second answer" in text and "more" not in text
    for tok, mask, lp in zip(node2.tokens, node2.masked_tokens, node2.logprobs, strict=True):
        assert lp == (MASKED_LOGPROB if mask == IGNORE_INDEX else fake_logprob(tok))
    assert node2.metadata["finish_reason"] == "stop"
    # The second request was sent as token ids that start with the first node's tokens.
    assert server.requests[-1].kwargs["input_ids"][: len(node1.tokens)] == node1.tokens


async def test_managed_completion_mode_also_extends(tiny_tokenizer):
    server = _fake(responses=[" world", "!"], tokenizer=tiny_tokenizer)
    managed = ManagedServer(server, tiny_tokenizer)
    c1 = await managed.completion(prompt="hello", max_tokens=20)
    node1 = managed.get_state()["nodes"][0]
    await managed.completion(prompt="hello" + c1.choices[0].text + "<|im_end|> again", max_tokens=20)
    node2 = managed.get_state()["nodes"][0]
    assert node2.masked_tokens[: len(node1.tokens)] == node1.masked_tokens  # upstream re-masked


async def test_max_tokens_truncation_reports_length(tiny_tokenizer):
    server = _fake(responses=["a long answer indeed"], tokenizer=tiny_tokenizer)
    async with ServerManager([server]).managed_server(tokenizer=tiny_tokenizer) as managed:
        completion = await managed.chat_completion(messages=MSG, n=2, max_tokens=3)
        nodes = managed.get_state()["nodes"]
    assert [c.finish_reason for c in completion.choices] == ["length", "length"]
    assert all(sum(m != IGNORE_INDEX for m in n.masked_tokens) == 3 for n in nodes)


def test_reasoning_config_extra_body():
    assert ReasoningConfig().build_extra_body("http://x") is None
    cfg = ReasoningConfig(effort="high")
    assert cfg.enabled is True
    assert cfg.build_extra_body("https://api.openai.com/v1") == {"reasoning_effort": "high"}
    assert cfg.build_extra_body("http://x", use_max_tokens=True) == {
        "reasoning": {"enabled": True, "max_tokens": 25600}}
    with pytest.raises(ValueError, match="Invalid reasoning_effort: 'extreme'; use one of none"):
        ReasoningConfig(effort="extreme")


def test_reasoning_config_from_an_env_config():
    """Atropos 0.4's ``ReasoningConfig.from_env_config``: any reasoning field enables it."""
    from atroposlib.envs.config import BaseEnvConfig

    assert ReasoningConfig.from_env_config(BaseEnvConfig()) == ReasoningConfig()
    assert ReasoningConfig.from_env_config(BaseEnvConfig(thinking_mode=True)) == ReasoningConfig(enabled=True)
    cfg = ReasoningConfig.from_env_config(BaseEnvConfig(reasoning_effort="low", max_reasoning_tokens=2000))
    assert (cfg.enabled, cfg.effort, cfg.max_tokens) == (True, "low", 2000)
    assert ReasoningConfig.from_env_config(object()) == ReasoningConfig()  # fields absent: unset


async def test_vllm_backend_managed_mode_over_http_against_the_fake_app(tiny_tokenizer, tiny_tokenizer_dir):
    from atroposlib.inference.clients.vllm_client import VLLMServer

    fake = FakeServer(["four", "five!"], tokenizer=tiny_tokenizer)
    with FakeOpenAIServer(fake) as http_server:
        config = APIServerConfig(base_url=http_server.base_url, api_key="x", model_name="fake",
                                 server_type="vllm", tokenizer_name=str(tiny_tokenizer_dir))
        manager = ServerManager(config)
        assert isinstance(manager.servers[0], VLLMServer)
        async with manager.managed_server(tokenizer=tiny_tokenizer) as managed:
            completion = await managed.chat_completion(messages=MSG, n=2, max_tokens=10)
            nodes = managed.get_state()["nodes"]
        assert [c.message.content for c in completion.choices] == ["four", "five!"]
        for node in nodes:
            generated = [(t, lp) for t, m, lp in zip(node.tokens, node.masked_tokens, node.logprobs,
                                                     strict=True) if m != IGNORE_INDEX]
            assert generated and all(lp == fake_logprob(t) for t, lp in generated)
            assert generated[-1][0] == tiny_tokenizer.eos_token_id  # a sampled EOS is kept
        await manager.aclose()


async def test_a_hanging_health_probe_counts_as_unhealthy_from_the_second_in_a_row(monkeypatch):
    from atroposlib.inference.clients import health

    monkeypatch.setattr(health, "HEALTH_PROBE_TIMEOUT", 0.2)

    class Hanging(FakeServer):
        async def _check_health(self):
            await asyncio.sleep(30)
            return True

    server = Hanging()
    assert server.server_healthy
    start = time.perf_counter()
    assert await server.check_health() is True  # one late answer: a busy server, not a dead one
    assert await server.check_health() is False  # two in a row: unhealthy
    assert await server.check_health() is False
    assert time.perf_counter() - start < 3


async def test_a_late_probe_between_good_ones_keeps_the_server_healthy(monkeypatch, caplog):
    from atroposlib.inference.clients import health

    monkeypatch.setattr(health, "HEALTH_PROBE_TIMEOUT", 0.2)
    delays = iter([0, 5, 0, 5, 0])

    class Busy(FakeServer):
        async def _check_health(self):
            await asyncio.sleep(next(delays))
            return True

    server = Busy()
    with caplog.at_level("WARNING", logger="atroposlib.inference.clients.health"):
        assert [await server.check_health() for _ in range(5)] == [True] * 5
    assert not [r for r in caplog.records if "UNHEALTHY" in r.getMessage()]


async def test_think_blocks_survive_templates_that_strip_them(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    # A Qwen3-like template: earlier assistant turns lose everything up to </think>.
    tok.chat_template = (
        "{% for m in messages %}{% set c = m['content'] %}"
        "{% if m['role'] == 'assistant' %}{% set c = c.split('</think>')[-1] %}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + c + '<|im_end|>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    server = _fake(responses=["<think>hmm</think>4", "ok"], tokenizer=tok)
    managed = ManagedServer(server, tok)
    first = await managed.chat_completion(messages=MSG, max_tokens=50)
    turn2 = MSG + [{"role": "assistant", "content": first.choices[0].message.content},
                   {"role": "user", "content": "sure?"}]
    await managed.chat_completion(messages=turn2, max_tokens=50)
    assert len(managed.get_state()["nodes"]) == 1  # extended: the think block was kept
    stripping = ManagedServer(_fake(responses=["<think>hmm</think>4", "ok"], tokenizer=tok), tok,
                              preserve_think_blocks=True)
    first = await stripping.chat_completion(messages=MSG, max_tokens=50)
    turn2[1] = {"role": "assistant", "content": first.choices[0].message.content}
    await stripping.chat_completion(messages=turn2, max_tokens=50)
    assert len(stripping.get_state()["nodes"]) == 2  # template stripped it: a fresh node


def test_every_server_type_maps_to_its_backend_class():
    from atroposlib.inference.clients.manager import server_class_for

    for server_type in ("openai", "vllm", "sglang", "trl"):
        config = APIServerConfig(base_url="http://127.0.0.1:9/v1", server_type=server_type,
                                 health_check=False, tokenizer_name="unused")
        server = ServerManager(config).servers[0]
        assert type(server) is server_class_for(server_type)
        assert server.config.base_url == "http://127.0.0.1:9/v1"
    with pytest.raises(ValueError, match="unknown server_type 'tgi'"):
        server_class_for("tgi")


async def test_managed_tool_calls_are_parsed_but_nodes_keep_the_raw_text(tiny_tokenizer):
    raw = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    server = _fake(responses=[raw], tokenizer=tiny_tokenizer)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    async with ServerManager([server]).managed_server(tokenizer=tiny_tokenizer,
                                                      tool_parser="hermes") as managed:
        completion = await managed.chat_completion(messages=MSG, tools=tools, max_tokens=100)
        node = managed.get_state()["nodes"][0]
        plain = await managed.chat_completion(messages=MSG, tools=tools, tool_choice="none",
                                              max_tokens=100)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls[0].function.name == "add"
    assert raw in node.full_text
    assert plain.choices[0].message.content == raw and plain.choices[0].finish_reason == "stop"


async def test_tools_reach_a_model_whose_chat_template_drops_them(tiny_tokenizer):
    # The tiny ChatML template (like SmolLM2's) has no tools section: with the hermes parser
    # the tools are declared in the system message, in the format the parser reads back.
    from atroposlib.inference.clients.managed import template_renders_tools

    assert not template_renders_tools(tiny_tokenizer)
    tools = [{"type": "function", "function": {"name": "facts_lookup", "description": "Look up",
                                               "parameters": {"type": "object"}}}]
    server = _fake(responses=["ok", "ok", "ok"], tokenizer=tiny_tokenizer)
    async with ServerManager([server]).managed_server(tokenizer=tiny_tokenizer,
                                                      tool_parser="hermes") as managed:
        await managed.chat_completion(messages=MSG, tools=tools, max_tokens=10)
        await managed.chat_completion(
            messages=[{"role": "system", "content": "Be brief."}, *MSG], tools=tools, max_tokens=10)
        await managed.chat_completion(messages=MSG, max_tokens=10)  # no tools: unchanged
        no_tools, with_system, plain = (n.full_text for n in managed.get_state()["nodes"][-3:])
    assert no_tools.startswith("<|im_start|>system\n# Tools\n")
    assert '<tools>\n{"name": "facts_lookup", "description": "Look up"' in no_tools
    assert "<tool_call>" in no_tools and no_tools.count("<|im_start|>system") == 1
    assert with_system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert plain.startswith("<|im_start|>user\nhi") and "<tools>" not in plain
    bare = ServerManager([_fake(responses=["ok"], tokenizer=tiny_tokenizer)])
    async with bare.managed_server(tokenizer=tiny_tokenizer) as managed:  # no parser: as given
        await managed.chat_completion(messages=MSG, tools=tools, max_tokens=10)
        assert "<tools>" not in managed.get_state()["nodes"][0].full_text


async def test_aclose_returns_even_when_the_health_task_swallows_its_cancel():
    """Python 3.11's asyncio.wait_for can swallow a cancel (gh-86296); aclose must not hang."""
    probe_started = asyncio.Event()

    class SwallowingServer(OpenAIServer):
        async def check_health(self) -> bool:
            probe_started.set()
            try:
                await asyncio.sleep(0.2)
            except asyncio.CancelledError:
                pass  # what the wait_for race does when the probe finishes as the cancel lands
            self._set_healthy(True)
            return True

    server = SwallowingServer(
        APIServerConfig(base_url="http://127.0.0.1:9/v1", model_name="m", health_check=True)
    )
    server._ensure_health_task()
    await probe_started.wait()
    health_task = server._health_task
    closing = asyncio.ensure_future(server.aclose())
    await asyncio.wait({closing}, timeout=5)  # asyncio.wait does not cancel on timeout
    try:
        assert closing.done(), "aclose() hung on a health task that swallowed its cancel"
        assert health_task.done() and server._health_task is None
    finally:
        server._closing = True  # let the unfixed loop end, so the test never leaks a task
        closing.cancel()
        health_task.cancel()
