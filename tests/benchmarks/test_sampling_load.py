"""The fixed sampling load of bench_delta_sync against a real (stand-in) completions server."""

from __future__ import annotations

import httpx
import pytest

from benchmarks.sampling_load import prompts, sampling_load
from tests.fixtures.app_thread import AppThread


def _completions_app(seen: list[dict]):
    from fastapi import FastAPI, HTTPException

    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(body: dict) -> dict:
        if body["model"] not in ("smollm2", "smollm2-base"):
            raise HTTPException(404, f"The model `{body['model']}` does not exist.")
        seen.append(body)
        return {"choices": [{"text": "x" * body["max_tokens"]}],
                "usage": {"completion_tokens": body["max_tokens"]}}

    return app


def test_the_load_sends_the_same_prompts_at_temperature_one_and_counts_tokens():
    seen: list[dict] = []
    with AppThread(_completions_app(seen)) as server:
        result = sampling_load(f"{server.url}/v1", "smollm2", requests=5, max_tokens=7, repeats=2)
    assert result["model"] == "smollm2" and result["requests"] == 5 and result["max_tokens"] == 7
    assert len(result["runs"]) == 2 and all(r > 0 for r in result["runs"])
    assert result["tokens_per_second"] == pytest.approx(sum(result["runs"]) / 2)  # the median of two
    warmup, timed = seen[0], seen[1:]
    assert warmup["max_tokens"] == 4 and len(timed) == 10
    # each repeat sends the same 5 prompts, all in flight at once (they may arrive in any order)
    assert sorted(b["prompt"] for b in timed[:5]) == sorted(b["prompt"] for b in timed[5:]) == sorted(prompts(5))
    assert all(b["temperature"] == 1.0 and b["ignore_eos"] and b["max_tokens"] == 7 for b in timed)
    assert len(set(prompts(20))) == 20


def test_an_unknown_model_name_is_a_clear_http_error():
    with AppThread(_completions_app([])) as server, pytest.raises(httpx.HTTPStatusError, match="404"):
        sampling_load(f"{server.url}/v1", "smollm2-lora", requests=2, max_tokens=3, repeats=1)
