"""``process`` stops at once when the inference server refuses every request (HTTP 4xx)."""

from __future__ import annotations

import time

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from atroposlib.env_runtime.process import REFUSAL_STREAK
from atroposlib.envs.base import APIServerConfig, BaseEnvConfig
from atroposlib.errors import RolloutError
from tests.fixtures.app_thread import AppThread
from tests.fixtures.sample_envs import ChatLengthEnv


def _refusing_server(status: int, calls: list[str]) -> FastAPI:
    """An OpenAI-compatible stand-in that answers every completion like vLLM refusing a request."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

    @app.get("/health")
    async def health():
        return {}

    @app.post("/v1/chat/completions")
    async def chat():
        calls.append("chat")
        return JSONResponse(
            {"object": "error", "message": "fake is not a multimodal model", "type": "BadRequestError",
             "param": None, "code": status},
            status_code=status,
        )

    return app


def _env(url: str, tiny_tokenizer, tmp_path) -> ChatLengthEnv:
    config = BaseEnvConfig(group_size=2, use_wandb=False, total_steps=50, max_consecutive_failures=200,
                           data_path_to_save_groups=str(tmp_path / "groups.jsonl"))
    server = APIServerConfig(model_name="fake", base_url=f"{url}/v1", api_key="x", server_type="openai")
    env = ChatLengthEnv(config, [server])
    env.tokenizer = tiny_tokenizer
    return env


async def test_process_stops_after_a_few_refused_requests_with_the_servers_message(tiny_tokenizer, tmp_path):
    calls: list[str] = []
    with AppThread(_refusing_server(400, calls)) as server:
        env = _env(server.url, tiny_tokenizer, tmp_path)
        start = time.monotonic()
        with pytest.raises(RolloutError) as info:
            await env.process_manager(show_progress=False)
        elapsed = time.monotonic() - start
    message = str(info.value)
    assert f"{REFUSAL_STREAK} items in a row with HTTP 400" in message
    assert "not a multimodal model" in message  # the server's own reason
    assert "--openai.model_name" in message  # and what to check
    assert len(calls) == REFUSAL_STREAK  # a 400 is not retried, and no fourth item is tried
    assert elapsed < 10


async def test_a_rate_limit_is_not_a_refusal(tiny_tokenizer, tmp_path):
    """429 is transient: the item is retried, and process does not stop at the refusal streak."""
    calls: list[str] = []
    with AppThread(_refusing_server(429, calls)) as server:
        env = _env(server.url, tiny_tokenizer, tmp_path)
        env.config.max_consecutive_failures = REFUSAL_STREAK + 2
        with pytest.raises(RolloutError) as info:
            await env.process_manager(show_progress=False)
    assert "items in a row produced no usable group" in str(info.value)
    assert len(calls) > REFUSAL_STREAK


def test_serve_warns_once_with_the_servers_reason_after_a_streak_of_refusals(caplog):
    """serve keeps running (an item may be the cause) but says what the server refuses, once."""
    from collections import Counter
    from types import SimpleNamespace

    import httpx
    import openai

    from atroposlib.env_runtime.scheduling import RolloutPacer
    from atroposlib.env_runtime.step import Outcome, Skip

    response = httpx.Response(400, request=httpx.Request("POST", "http://127.0.0.1/v1/chat/completions"))
    error = openai.BadRequestError("fake is not a multimodal model", response=response, body=None)
    env = SimpleNamespace(config=SimpleNamespace(), stats=Counter())
    pacer = RolloutPacer(env, SimpleNamespace(max_seq_len=64), inference_backoff_max=1, reject_streak=5)
    with caplog.at_level("WARNING", logger="atroposlib.env_runtime.scheduling"):
        for _ in range(REFUSAL_STREAK + 2):
            pacer.note(Outcome(reason=Skip.ERROR, error=error))
    refusals = [r.getMessage() for r in caplog.records if "refused the request" in r.getMessage()]
    assert len(refusals) == 1
    assert "HTTP 400" in refusals[0] and "not a multimodal model" in refusals[0]
