"""Tests of the ManagedServer OpenAI proxy: real uvicorn on 127.0.0.1, fake or real vLLM backend."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from atroposlib.compat.managed_server_proxy import (
    ProxyConfig,
    ProxyError,
    ProxySettings,
    check_chat_message,
    create_app,
    create_proxy_session,
)
from atroposlib.testing.fake_server import FakeOpenAIServer, FakeServer, fake_logprob
from tests.fixtures.api_server import free_port

REPLIES = ["Hello there.", "Bye now, friend."]
MESSAGES = [{"role": "user", "content": "Say hi"}]


class ProxyThread:
    """The proxy app served by uvicorn in a background thread (lifespan on: the reaper runs)."""

    def __init__(self, config: Any, settings: ProxySettings | None = None, app: Any = None):
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = app if app is not None else create_app(config, settings)
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> ProxyThread:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            assert self._thread.is_alive() and time.monotonic() < deadline, "proxy did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)


@pytest.fixture(scope="module")
def backend(tiny_tokenizer) -> Iterator[FakeOpenAIServer]:
    """A fake vLLM-compatible OpenAI server (token-id completions with fake log-probs)."""
    with FakeOpenAIServer(FakeServer(REPLIES, tokenizer=tiny_tokenizer, model_name="fake")) as fake:
        yield fake


@pytest.fixture(scope="module")
def proxy_config(backend, tiny_tokenizer_dir) -> dict[str, Any]:
    return {
        "model_name": "fake",
        "tokenizer_name": str(tiny_tokenizer_dir),
        "servers": [{"base_url": backend.base_url, "server_type": "vllm", "api_key": "x"}],
    }


@pytest.fixture(scope="module")
def proxy(proxy_config) -> Iterator[ProxyThread]:
    with ProxyThread(proxy_config) as running:
        yield running


def _session(url: str, **body: Any) -> str:
    response = httpx.post(f"{url}/sessions/create", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["uuid"]


def _assert_openai_error(response: httpx.Response, status: int, type_: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code"}
    assert error["type"] == type_
    assert error["message"]
    return error


def test_chat_completion_n2_tracks_aligned_nodes(proxy, tiny_tokenizer):
    sid = _session(proxy.url)
    render = httpx.post(f"{proxy.url}/{sid}/v1/chat/completions/render",
                        json={"messages": MESSAGES}).json()
    expected_prompt = tiny_tokenizer.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    assert render["prompt_text"] == expected_prompt
    assert render["token_ids"] == tiny_tokenizer.encode(expected_prompt, add_special_tokens=False)
    assert render["num_tokens"] == len(render["token_ids"])

    response = httpx.post(
        f"{proxy.url}/{sid}/v1/chat/completions",
        json={"messages": MESSAGES, "n": 2, "max_tokens": 64, "model": "anything"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == "fake"
    contents = sorted(c["message"]["content"] for c in body["choices"])
    assert contents == sorted(REPLIES)
    assert [c["index"] for c in body["choices"]] == [0, 1]

    nodes = httpx.get(f"{proxy.url}/{sid}/nodes").json()["nodes"]
    assert len(nodes) == 2
    prompt_ids = render["token_ids"]
    for node, choice in zip(nodes, body["choices"], strict=True):
        tokens, masks, logprobs = node["tokens"], node["masked_tokens"], node["logprobs"]
        assert len(tokens) == len(masks) == len(logprobs)
        p = len(prompt_ids)
        assert tokens[:p] == prompt_ids
        assert masks[:p] == [-100] * p and logprobs[:p] == [1.0] * p
        completion = tokens[p:]
        assert masks[p:] == completion
        assert logprobs[p:] == [fake_logprob(t) for t in completion]
        assert completion[-1] == tiny_tokenizer.eos_token_id  # finish_reason stop keeps EOS
        assert tiny_tokenizer.decode(completion, skip_special_tokens=True) == (
            choice["message"]["content"]
        )
        assert tiny_tokenizer.decode(tokens) == node["full_text"]
        assert node["metadata"]["finish_reason"] == choice["finish_reason"] == "stop"

    listed = httpx.get(f"{proxy.url}/sessions").json()["sessions"]
    mine = next(s for s in listed if s["uuid"] == sid)
    assert mine["num_nodes"] == 2 and mine["model_name"] == "fake"

    assert httpx.delete(f"{proxy.url}/{sid}").json() == {"status": "deleted", "uuid": sid, "deleted": True}
    _assert_openai_error(httpx.get(f"{proxy.url}/{sid}/nodes"), 404, "not_found_error")


def test_stream_true_serves_the_tracked_response_as_sse(proxy, tiny_tokenizer):
    """The OpenAI SDK's streaming reader gets the same answer (and usage) a plain call gets."""
    from openai import AsyncOpenAI

    sid = _session(proxy.url)

    async def run() -> tuple[Any, Any]:
        client = AsyncOpenAI(base_url=f"{proxy.url}/{sid}/v1", api_key="x")
        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True},
            max_tokens=64)
        chunks = [chunk async for chunk in stream]
        await client.close()
        return chunks

    chunks = asyncio.run(run())
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    node = httpx.get(f"{proxy.url}/{sid}/nodes").json()["nodes"][0]
    completion = [t for t, m in zip(node["tokens"], node["masked_tokens"], strict=True) if m != -100]
    assert content in REPLIES and finish == ["stop"]
    assert tiny_tokenizer.decode(completion, skip_special_tokens=True) == content
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage.completion_tokens == len(completion)
    assert usage.prompt_tokens == len(node["tokens"]) - len(completion)
    httpx.delete(f"{proxy.url}/{sid}")


def test_max_tokens_truncation_is_length(proxy):
    sid = _session(proxy.url)
    body = httpx.post(f"{proxy.url}/{sid}/v1/chat/completions",
                      json={"messages": MESSAGES, "max_completion_tokens": 3}, timeout=30).json()
    assert body["choices"][0]["finish_reason"] == "length"
    node = httpx.get(f"{proxy.url}/{sid}/nodes").json()["nodes"][0]
    assert sum(m != -100 for m in node["masked_tokens"]) == 3


def test_client_session_multi_turn_extends_node(proxy, tiny_tokenizer):
    async def run() -> None:
        async with await create_proxy_session(proxy.url) as managed:
            assert managed.base_url == f"{proxy.url}/{managed.uuid}/v1"
            first = await managed.chat_completion(messages=MESSAGES, max_tokens=64, split="train")
            reply = first.choices[0].message.content
            [node1] = managed.get_state()["nodes"]
            turn2 = MESSAGES + [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": "Again"},
            ]
            await managed.chat_completion(messages=turn2, max_tokens=64)
            [node2] = managed.get_state()["nodes"]  # extended in place, not a new node
            # The first turn's exact tokens, masks and log-probs are kept (still trained).
            n1 = len(node1.tokens)
            assert node2.tokens[:n1] == node1.tokens
            assert node2.masked_tokens[:n1] == node1.masked_tokens
            assert node2.logprobs[:n1] == node1.logprobs
            assert len(node2.tokens) > n1
            assert sum(m != -100 for m in node2.masked_tokens) > sum(
                m != -100 for m in node1.masked_tokens
            )
            uuid = managed.uuid
        with pytest.raises(ProxyError) as info:  # deleted on exit
            async with httpx.AsyncClient() as client:
                from atroposlib.compat.managed_server_proxy import ProxyManagedServer

                gone = ProxyManagedServer(proxy.url, {"uuid": uuid}, client=client)
                await gone.fetch_state()
        assert info.value.status_code == 404 and info.value.code == "session_not_found"

    asyncio.run(run())


def test_server_manager_uses_the_proxy_when_configured(proxy, backend):
    from atroposlib.compat.managed_server_proxy import ProxyManagedServer
    from atroposlib.inference.clients.config import APIServerConfig
    from atroposlib.inference.clients.manager import ServerManager

    manager = ServerManager(
        [APIServerConfig(base_url="http://127.0.0.1:9/v1", server_type="vllm", model_name="m")],
        proxy_url=proxy.url,
    )

    async def run() -> str:
        async with manager.managed_server(track_tree=True) as managed:
            assert isinstance(managed, ProxyManagedServer)
            await managed.chat_completion(messages=MESSAGES, n=2, max_tokens=64)
            state = managed.get_state()
            assert len(state["nodes"]) == 2
            assert all(parent is None for parent in state["tree"].values())
            assert set(state["tree"]) == {node.full_text for node in state["nodes"]}
            return managed.uuid

    uuid = asyncio.run(run())
    assert httpx.get(f"{proxy.url}/{uuid}/nodes").status_code == 404  # deleted on exit


def test_bad_input_is_a_clear_4xx(proxy):
    url = proxy.url
    error = _assert_openai_error(
        httpx.post(f"{url}/not-a-session/v1/chat/completions", json={"messages": MESSAGES}),
        404, "not_found_error",
    )
    assert error["code"] == "session_not_found" and "/sessions/create" in error["message"]
    _assert_openai_error(httpx.delete(f"{url}/not-a-session"), 404, "not_found_error")

    sid = _session(url)
    chat = f"{url}/{sid}/v1/chat/completions"
    error = _assert_openai_error(httpx.post(chat, json={"messages": []}), 400,
                                 "invalid_request_error")
    assert "messages" in error["message"] and "at least one" in error["message"]
    error = _assert_openai_error(httpx.post(chat, json={}), 400, "invalid_request_error")
    assert "messages" in error["message"]
    error = _assert_openai_error(httpx.post(chat, json={"messages": [{"content": "x"}]}), 400,
                                 "invalid_request_error")
    assert "role" in error["message"]
    _assert_openai_error(httpx.post(chat, json={"messages": MESSAGES, "n": 0}), 400,
                         "invalid_request_error")
    _assert_openai_error(httpx.post(chat, content=b"{not json",
                                    headers={"content-type": "application/json"}),
                         400, "invalid_request_error")
    error = _assert_openai_error(
        httpx.post(f"{url}/sessions/create", json={"base_url": "http://nowhere:1/v1"}),
        404, "not_found_error",
    )
    assert "nowhere" in error["message"]
    _assert_openai_error(httpx.post(f"{url}/sessions/create", json={"track_tre": True}), 400,
                         "invalid_request_error")
    # Nothing above created or broke state: the session still answers.
    assert httpx.post(chat, json={"messages": MESSAGES}, timeout=30).status_code == 200
    httpx.delete(f"{url}/{sid}")


BAD_MESSAGES = [
    ([{"role": "user"}], "has no 'content'"),
    ([{"role": "user", "content": None}], "content null"),
    ([{"role": "system", "content": 5}], "must be a string or a list of content parts, got int"),
    ([{"role": "user", "content": {"text": "hi"}}], "got dict"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     "text-only"),
    ([{"role": "user", "content": [{"type": "text"}]}], "needs a string 'text'"),
    ([{"role": "user", "content": ["hi"]}], "content[0] is str"),
    ([{"role": "assistant"}], "only an assistant message with tool_calls"),
    ([{"role": "user", "content": "hi"}, {"role": "tool", "content": [1]}], "messages[1]"),
]


@pytest.mark.parametrize(("messages", "expected"), BAD_MESSAGES)
def test_malformed_message_content_is_a_400_everywhere(proxy, messages, expected):
    # OpenAI: content is a string or a list of content parts; missing/null only for an
    # assistant message with tool_calls. Chat completions and /render answer alike.
    sid = _session(proxy.url)
    for path in ("v1/chat/completions", "v1/chat/completions/render"):
        response = httpx.post(f"{proxy.url}/{sid}/{path}", json={"messages": messages},
                              timeout=30)
        error = _assert_openai_error(response, 400, "invalid_request_error")
        assert expected in error["message"], (path, error["message"])
    assert httpx.post(f"{proxy.url}/{sid}/v1/chat/completions", json={"messages": MESSAGES},
                      timeout=30).status_code == 200
    httpx.delete(f"{proxy.url}/{sid}")


def test_text_parts_are_joined_like_a_string(proxy):
    sid = _session(proxy.url)
    render = f"{proxy.url}/{sid}/v1/chat/completions/render"
    parts = [{"role": "user", "content": [{"type": "text", "text": "Say"},
                                          {"type": "text", "text": "hi"}]}]
    as_parts = httpx.post(render, json={"messages": parts}).json()
    as_text = httpx.post(render, json={"messages": [{"role": "user", "content": "Say\nhi"}]})
    assert as_parts == as_text.json()
    response = httpx.post(f"{proxy.url}/{sid}/v1/chat/completions", json={"messages": parts},
                          timeout=30)
    assert response.status_code == 200, response.text
    httpx.delete(f"{proxy.url}/{sid}")


def test_assistant_tool_call_message_may_omit_content():
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    for message in ({"role": "assistant", "tool_calls": call},
                    {"role": "assistant", "content": None, "tool_calls": call}):
        assert check_chat_message(0, message) == {"role": "assistant", "content": "",
                                                  "tool_calls": call}
    refusal = {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}
    assert check_chat_message(0, refusal)["content"] == "no"
    with pytest.raises(ValueError, match="tool_calls must be a list"):
        check_chat_message(0, {"role": "assistant", "tool_calls": {"id": "c1"}})
    with pytest.raises(ValueError, match="'text'"):
        check_chat_message(0, {"role": "user", "content": [{"type": "refusal", "refusal": "x"}]})


def test_service_endpoints(proxy, backend):
    health = httpx.get(f"{proxy.url}/health").json()
    assert health["status"] == "ok" and health["model"] == "fake"
    assert health["servers"] == 1 and health["healthy_servers"] == 1
    assert isinstance(health["sessions"], int)
    models = httpx.get(f"{proxy.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["fake"]
    servers = httpx.get(f"{proxy.url}/servers").json()["servers"]
    assert servers == [{"base_url": backend.base_url, "server_type": "vllm",
                        "model_name": "fake", "healthy": True}]
    info = httpx.post(f"{proxy.url}/sessions/create",
                      json={"base_url": backend.base_url, "tool_parser": None}).json()
    assert info["base_url"] == backend.base_url and info["tool_parser"] is None
    assert info["expires_at"] == pytest.approx(info["created_at"] + 3600)
    httpx.delete(f"{proxy.url}/{info['uuid']}")


def test_backend_failures_are_openai_errors(proxy_config):
    with ProxyThread(proxy_config) as running:
        sid = _session(running.url)
        server = running.app.state.proxy.sessions[sid].managed.server

        async def explode(**kwargs: Any) -> Any:
            raise RuntimeError("backend exploded")

        server.tokens_and_logprobs_completion = explode
        error = _assert_openai_error(
            httpx.post(f"{running.url}/{sid}/v1/chat/completions", json={"messages": MESSAGES}),
            500, "server_error",
        )
        assert "backend exploded" in error["message"]
        assert httpx.get(f"{running.url}/{sid}/nodes").json() == {"nodes": []}

    openai_config = {**proxy_config, "servers": [{**proxy_config["servers"][0],
                                                  "server_type": "openai"}]}
    with ProxyThread(openai_config) as running:
        error = _assert_openai_error(httpx.post(f"{running.url}/sessions/create"), 400,
                                     "invalid_request_error")
        assert "server_type 'vllm'" in error["message"]


def test_concurrent_calls_in_one_session_are_all_tracked(proxy):
    sid = _session(proxy.url)

    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=30) as client:
            calls = [
                client.post(f"{proxy.url}/{sid}/v1/chat/completions",
                            json={"messages": [{"role": "user", "content": f"q{i}"}]})
                for i in range(4)
            ]
            return [r.status_code for r in await asyncio.gather(*calls)]

    assert asyncio.run(run()) == [200] * 4
    nodes = httpx.get(f"{proxy.url}/{sid}/nodes").json()["nodes"]
    assert sorted(n["full_text"].split("<|im_end|>")[0] for n in nodes) == [
        f"<|im_start|>user\nq{i}" for i in range(4)
    ]
    httpx.delete(f"{proxy.url}/{sid}")


def test_idle_sessions_expire(proxy_config):
    # a TTL of seconds (not tenths) so a loaded machine's slow requests do not expire `busy`
    with ProxyThread(proxy_config, ProxySettings(session_ttl_s=3.0)) as running:
        idle = _session(running.url)
        busy = _session(running.url)
        active_until = time.monotonic() + 4.5  # longer than the TTL: activity on `busy` only
        while time.monotonic() < active_until:
            time.sleep(0.3)
            assert httpx.get(f"{running.url}/{busy}/nodes").status_code == 200
        error = _assert_openai_error(httpx.get(f"{running.url}/{idle}/nodes"), 404,
                                     "not_found_error")
        assert error["code"] == "session_expired" and "--session-ttl" in error["message"]
        deadline = time.monotonic() + 30  # the background reaper removes `busy` unasked
        while running.app.state.proxy.sessions and time.monotonic() < deadline:
            time.sleep(0.2)
        assert running.app.state.proxy.sessions == {}
        assert httpx.get(f"{running.url}/health").json()["sessions"] == 0


def test_session_cap_answers_429(proxy_config):
    with ProxyThread(proxy_config, ProxySettings(max_sessions=2)) as running:
        first = _session(running.url)
        _session(running.url)
        error = _assert_openai_error(httpx.post(f"{running.url}/sessions/create"), 429,
                                     "rate_limit_error")
        assert error["code"] == "too_many_sessions" and "--max-sessions" in error["message"]
        httpx.delete(f"{running.url}/{first}")
        _session(running.url)


def test_unconfigured_proxy_then_setup(proxy_config, backend):
    with ProxyThread(None) as running:
        assert httpx.get(f"{running.url}/health").json()["status"] == "not_configured"
        error = _assert_openai_error(httpx.post(f"{running.url}/sessions/create"), 503,
                                     "server_error")
        assert "/setup" in error["message"]
        _assert_openai_error(httpx.post(f"{running.url}/setup", json={"servers": []}), 400,
                             "invalid_request_error")
        answer = httpx.post(f"{running.url}/setup", json=proxy_config, timeout=30).json()
        assert answer == {"status": "ok", "model": "fake", "servers": 1, "dropped_sessions": 0}
        sid = _session(running.url)
        assert httpx.post(f"{running.url}/{sid}/v1/chat/completions",
                          json={"messages": MESSAGES}, timeout=30).status_code == 200
        again = httpx.post(f"{running.url}/setup", json=proxy_config, timeout=30).json()
        assert again["dropped_sessions"] == 1
        _assert_openai_error(httpx.get(f"{running.url}/{sid}/nodes"), 404, "not_found_error")


def test_failed_setup_keeps_the_working_configuration(proxy_config, tmp_path):
    with ProxyThread(proxy_config) as running:
        sid = _session(running.url)
        chat = f"{running.url}/{sid}/v1/chat/completions"
        assert httpx.post(chat, json={"messages": MESSAGES}, timeout=30).status_code == 200
        broken = {**proxy_config, "model_name": "other",
                  "tokenizer_name": str(tmp_path / "no-such-tokenizer")}
        error = _assert_openai_error(httpx.post(f"{running.url}/setup", json=broken, timeout=30),
                                     400, "invalid_request_error")
        assert "no-such-tokenizer" in error["message"]
        assert "previous configuration is still active" in error["message"]
        # the old backends, model and sessions still work
        health = httpx.get(f"{running.url}/health").json()
        assert health["status"] == "ok" and health["model"] == "fake"
        assert httpx.post(chat, json={"messages": MESSAGES}, timeout=30).status_code == 200
        assert len(httpx.get(f"{running.url}/{sid}/nodes").json()["nodes"]) == 2
        other = _session(running.url)
        assert httpx.post(f"{running.url}/{other}/v1/chat/completions",
                          json={"messages": MESSAGES}, timeout=30).status_code == 200


def test_config_fills_server_defaults(tmp_path):
    config = ProxyConfig.model_validate(
        {"model_name": "m", "tokenizer_name": "t", "servers": [{"base_url": "http://h:1/v1"}]}
    )
    [server] = config.servers
    assert (server.model_name, server.tokenizer_name, server.server_type) == ("m", "t", "vllm")
    bad = tmp_path / "servers.json"
    bad.write_text(json.dumps({"model_name": "m", "servers": [{"server_type": "nope"}]}))
    result = subprocess.run(
        [sys.executable, "-m", "atroposlib.compat.managed_server_proxy",
         "--config", str(bad)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "server_type" in result.stderr and "servers.json" not in result.stdout


def test_help_is_fast_and_imports_no_heavy_modules():
    code = (
        "import sys, atroposlib.compat.managed_server_proxy as m\n"
        "heavy = [k for k in ('torch', 'transformers', 'vllm', 'fastapi', 'uvicorn') "
        "if k in sys.modules]\n"
        "assert not heavy, heavy\n"
        "m.build_parser().format_help()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.e2e
def test_proxy_through_real_vllm(vllm_server):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(vllm_server.model_dir))
    config = {
        "model_name": vllm_server.model_name,
        "tokenizer_name": str(vllm_server.model_dir),
        "servers": [{"base_url": vllm_server.base_url, "server_type": "vllm", "api_key": "x"}],
    }
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    with ProxyThread(config) as running:
        sid = _session(running.url)
        render = httpx.post(f"{running.url}/{sid}/v1/chat/completions/render",
                            json={"messages": messages}).json()
        response = httpx.post(
            f"{running.url}/{sid}/v1/chat/completions",
            json={"messages": messages, "max_tokens": 8, "temperature": 0.0},
            timeout=300,
        )
        assert response.status_code == 200, response.text
        content = response.json()["choices"][0]["message"]["content"]
        [node] = httpx.get(f"{running.url}/{sid}/nodes").json()["nodes"]
    prompt_ids = render["token_ids"]
    p = len(prompt_ids)
    assert node["tokens"][:p] == prompt_ids
    completion = node["tokens"][p:]
    assert 1 <= len(completion) <= 8
    assert tokenizer.decode(node["tokens"]) == render["prompt_text"] + tokenizer.decode(completion)
    assert tokenizer.decode(node["tokens"]) == node["full_text"]
    assert tokenizer.decode(completion, skip_special_tokens=True) == content
    assert node["masked_tokens"] == [-100] * p + completion
    assert all(lp <= 0.0 for lp in node["logprobs"][p:])
    assert node["logprobs"][:p] == [1.0] * p


def test_create_app_serves_a_prebuilt_server_manager(tiny_tokenizer):
    from atroposlib.inference.clients.manager import ServerManager

    manager = ServerManager([FakeServer(REPLIES, tokenizer=tiny_tokenizer, model_name="fake")])
    app = create_app(server_manager=manager, tokenizer=tiny_tokenizer, model_name="prebuilt")
    with ProxyThread(None, app=app) as running:
        health = httpx.get(f"{running.url}/health", timeout=10).json()
        assert health["status"] == "ok" and health["model"] == "prebuilt"
        sid = _session(running.url)
        response = httpx.post(f"{running.url}/{sid}/v1/chat/completions",
                              json={"messages": MESSAGES, "max_tokens": 32}, timeout=30)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] in REPLIES
        nodes = httpx.get(f"{running.url}/{sid}/nodes", timeout=10).json()["nodes"]
        assert len(nodes) == 1
    with pytest.raises(TypeError, match="not both"):
        create_app({"model_name": "m", "servers": []}, server_manager=manager,
                   tokenizer=tiny_tokenizer, model_name="m")
    with pytest.raises(TypeError, match="all three"):
        create_app(server_manager=manager, model_name="m")
