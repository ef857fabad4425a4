"""SGLang and TRL backends against small in-process fakes of their wire formats (no real servers)."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI, Request

from atroposlib.errors import InferenceError
from atroposlib.inference.bundled import bundled_model_dir
from atroposlib.inference.clients.config import APIServerConfig
from atroposlib.inference.clients.manager import ServerManager, server_class_for
from atroposlib.inference.clients.sglang_client import SGLangServer, finish_reason_of
from atroposlib.inference.clients.trl_vllm_client import TrlVllmServer

BUNDLED = bundled_model_dir()
# The session fixture builds the bundled model when missing (a fresh machine), so these
# tests run rather than skip there.
needs_tokenizer = pytest.mark.usefixtures("bundled_model_dir")


def _asgi(server, app: FastAPI) -> None:
    server.http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://fake", timeout=30
    )


def _config(server_type: str, **kw) -> APIServerConfig:
    return APIServerConfig(
        server_type=server_type,
        base_url="http://fake:1/v1",
        model_name="m",
        tokenizer_name=str(BUNDLED),
        health_check=False,
        **kw,
    )


def test_server_types_resolve_to_these_classes():
    assert server_class_for("sglang") is SGLangServer
    assert server_class_for("trl") is TrlVllmServer
    with pytest.raises(ValueError, match="server_type 'sglang' needs base_url, e.g. --openai.base_url"):
        SGLangServer(APIServerConfig(server_type="sglang", base_url=""))
    with pytest.raises(ValueError, match="server_type 'trl' needs base_url, the `trl vllm-serve`"):
        TrlVllmServer(APIServerConfig(server_type="trl", base_url=None))


def test_finish_reason_is_unwrapped():
    assert finish_reason_of({"finish_reason": {"type": "length", "length": 8}}) == "length"
    assert finish_reason_of({"finish_reason": "stop"}) == "stop"
    assert finish_reason_of({}) == "stop"


# ------------------------------------------------------------------------------------ SGLang
def _fake_sglang(received: list[dict], eos: int = 2) -> FastAPI:
    """SGLang /generate: output k is [10+k, 11+k, eos] for k even (stop), [10+k]*max for odd."""
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {}

    @app.post("/generate")
    async def generate(request: Request):
        body = await request.json()
        received.append(body)
        params = body["sampling_params"]
        outs = []
        for k in range(params.get("n", 1)):
            ids = [10 + k, 11 + k, eos] if k % 2 == 0 else [10 + k] * params["max_new_tokens"]
            reason = {"type": "stop"} if k % 2 == 0 else {"type": "length", "length": len(ids)}
            outs.append(
                {
                    "text": "ignored",
                    "meta_info": {
                        "output_token_logprobs": [
                            [-0.25 * (i + 1), t, None] for i, t in enumerate(ids)
                        ],
                        "finish_reason": reason,
                    },
                }
            )
        return outs if len(outs) > 1 else outs[0]

    return app


async def test_sglang_generate_request_and_parsing():
    received: list[dict] = []
    server = SGLangServer(_config("sglang"))
    _asgi(server, _fake_sglang(received))
    assert await server.check_health()
    prompt, outputs, logprobs, reasons = await server.tokens_and_logprobs_completion(
        input_ids=[1, 5, 9], n=2, max_tokens=4, temperature=0.5, stop=["\n"]
    )
    body = received[-1]
    assert body["input_ids"] == [1, 5, 9]
    assert body["return_logprob"] is True and body["return_text_in_logprobs"] is False
    assert body["sampling_params"] == {
        "n": 2,
        "max_new_tokens": 4,
        "temperature": 0.5,
        "stop": ["\n"],
    }
    assert prompt == [1, 5, 9]
    assert outputs == [[10, 11, 2], [11, 11, 11, 11]]
    assert logprobs == [[-0.25, -0.5, -0.75], [-0.25, -0.5, -0.75, -1.0]]
    assert reasons == ["stop", "length"]
    # a single output comes back as one object, not a list
    _, outputs, _, _ = await server.tokens_and_logprobs_completion(input_ids=[3], max_tokens=2)
    assert outputs == [[10, 11, 2]]
    await server.aclose()


async def test_sglang_answer_without_logprobs_is_a_clear_error():
    app = FastAPI()

    @app.post("/generate")
    async def generate():
        return {"text": "hi", "meta_info": {}}

    server = SGLangServer(_config("sglang"))
    _asgi(server, app)
    with pytest.raises(InferenceError, match="output_token_logprobs"):
        await server.tokens_and_logprobs_completion(input_ids=[1], max_tokens=1)


@needs_tokenizer
async def test_sglang_feeds_managed_server(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(BUNDLED)
    manager = ServerManager([_config("sglang")])
    _asgi(manager.servers[0], _fake_sglang([], eos=tok.eos_token_id))
    async with manager.managed_server(tokenizer=tok) as managed:
        completion = await managed.chat_completion(
            messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=3
        )
        nodes = managed.get_state()["nodes"]
    prompt_ids = tok.encode(
        tok.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
        ),
        add_special_tokens=False,
    )
    assert [c.finish_reason for c in completion.choices] == ["stop", "length"]
    assert nodes[0].tokens == prompt_ids + [10, 11, tok.eos_token_id]
    assert nodes[0].masked_tokens == [-100] * len(prompt_ids) + [10, 11, tok.eos_token_id]
    assert nodes[1].logprobs[len(prompt_ids) :] == [-0.25, -0.5, -0.75]


# ------------------------------------------------------------------------------------ TRL
def _fake_trl(received: list[dict], eos: int) -> FastAPI:
    app = FastAPI()

    @app.get("/health/")
    async def health():
        return {"status": "ok"}

    @app.post("/generate/")
    async def generate(request: Request):
        body = await request.json()
        received.append(body)
        hello = [19556, 17]  # "Hello!"
        return {
            "completion_ids": [hello + [eos] if k == 0 else hello * 3 for k in range(body["n"])]
        }

    return app


@needs_tokenizer
async def test_trl_chat_renders_the_template_and_decodes():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(BUNDLED)
    received: list[dict] = []
    server = TrlVllmServer(_config("trl"))
    _asgi(server, _fake_trl(received, tok.eos_token_id))
    assert await server.check_health()
    messages = [{"role": "user", "content": "Say hello."}]
    completion = await server.chat_completion(messages=messages, n=2, max_tokens=6, temperature=0.7)
    body = received[-1]
    assert body["prompts"] == [
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ]
    assert body["n"] == 2 and body["max_tokens"] == 6 and body["temperature"] == 0.7
    assert body["top_k"] == -1 and body["repetition_penalty"] == 1.0 and body["min_p"] == 0.0
    assert [c.message.content for c in completion.choices] == ["Hello!", "Hello!Hello!Hello!"]
    assert [c.finish_reason for c in completion.choices] == ["stop", "length"]
    text = await server.completion(prompt="Once upon", max_tokens=3)
    assert received[-1]["prompts"] == ["Once upon"] and text.choices[0].text == "Hello!"
    with pytest.raises(NotImplementedError, match="vllm"):
        await server.tokens_and_logprobs_completion(prompt="x", max_tokens=1)
    await server.aclose()


@needs_tokenizer
async def test_trl_posts_with_aiohttp_to_a_real_server():
    """With aiohttp installed (the envs extra), requests go through an aiohttp session."""
    from transformers import AutoTokenizer

    from tests.fixtures.app_thread import AppThread

    eos = AutoTokenizer.from_pretrained(BUNDLED).eos_token_id
    received: list[dict] = []
    with AppThread(_fake_trl(received, eos)) as app:
        server = TrlVllmServer(APIServerConfig(server_type="trl", base_url=app.url + "/v1",
                                               model_name="m", tokenizer_name=str(BUNDLED)))
        assert server.http is None  # no httpx client: aiohttp does the requests
        assert await server.check_health()
        completion = await server.chat_completion(messages=[{"role": "user", "content": "Hi"}],
                                                  n=2, max_tokens=6)
        assert received[-1]["n"] == 2 and received[-1]["max_tokens"] == 6
        assert [c.finish_reason for c in completion.choices] == ["stop", "length"]
        assert server.session is not None
        await server.aclose()
        assert server.session is None


async def test_trl_module_names_atropos_code_patches_are_the_ones_used():
    """Atropos 0.4 code patches ``AutoTokenizer`` and ``aiohttp.ClientSession`` in the TRL
    server module (by its old path); both must be what the client calls (no hub download)."""
    from unittest.mock import patch

    class Tok:
        eos_token_id = 2

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
            return "|".join(m["content"] for m in messages)

        def decode(self, ids, skip_special_tokens=False):
            return f"decoded {list(ids)}"

    posted = []

    class Response:
        async def json(self):
            return {"completion_ids": [[5, 2]]}

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return False

    class Session:
        def post(self, url, json):
            posted.append((url, json))
            return Response()

    old = "atroposlib.envs.server_handling.trl_vllm_server"
    with patch(f"{old}.AutoTokenizer") as auto, patch(f"{old}.aiohttp.ClientSession") as cls:
        auto.from_pretrained.return_value = Tok()
        cls.return_value = Session()
        server = TrlVllmServer(APIServerConfig(server_type="trl", base_url="http://127.0.0.1:9",
                                               model_name="hub/model", health_check=False))
        result = await server.chat_completion(messages=[{"role": "user", "content": "Hi"}])
    auto.from_pretrained.assert_called_once_with("hub/model")
    assert posted[0][0] == "http://127.0.0.1:9/generate/" and posted[0][1]["prompts"] == ["Hi"]
    assert result.choices[0].message.content == "decoded [5, 2]"
    assert result.choices[0].finish_reason == "stop"
