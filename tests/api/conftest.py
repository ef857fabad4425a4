"""Fixtures for in-process API tests (httpx.ASGITransport, no ports) and group builders."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from atroposlib.api.factory import build_app
from atroposlib.api.settings import ApiSettings

REGISTRATION = {
    "wandb_group": "grp", "wandb_project": "proj", "batch_size": 4, "max_token_len": 256,
    "checkpoint_dir": "ckpt", "save_checkpoint_interval": 10, "starting_step": 0, "num_steps": 100,
}


def make_group(n: int = 2, length: int = 5, env_id: int | None = None, seed: int = 0,
               **extra: Any) -> dict[str, Any]:
    """A valid scored group of ``n`` sequences of ``length`` tokens (masked prompt of 2)."""
    rng = random.Random(seed)
    tokens = [[rng.randrange(1, 50_000) for _ in range(length)] for _ in range(n)]
    masks = [[-100, -100, *row[2:]] for row in tokens]
    logprobs = [[1.0, 1.0, *(-rng.random() * 5 for _ in row[2:])] for row in tokens]
    group = {"tokens": tokens, "masks": masks, "scores": [rng.random() for _ in range(n)],
             "inference_logprobs": logprobs}
    if env_id is not None:
        group["env_id"] = env_id
    group.update(extra)
    return group


def make_app(**settings: Any):
    """An app whose Host check also accepts ``api`` (the in-process clients' base URL)."""
    settings.setdefault("allowed_hosts", ["api"])
    return build_app(ApiSettings(**settings))


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """In-process client of a fresh in-memory app."""
    app = make_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
        c.app = app  # type: ignore[attr-defined]
        yield c


async def register(c: httpx.AsyncClient, **overrides: Any) -> None:
    response = await c.post("/register", json={**REGISTRATION, **overrides})
    assert response.status_code == 200, response.text


async def start_trainer(c: httpx.AsyncClient, **overrides: Any) -> None:
    """Register the trainer and do its first /batch poll (so envs may register)."""
    await register(c, **overrides)
    assert (await c.get("/batch")).status_code == 200


async def register_env(c: httpx.AsyncClient, group_size: int = 2, name: str = "env",
                       weight: float = 1.0, max_token_length: int = 256,
                       min_batch_allocation: float | None = None) -> int:
    body = {"max_token_length": max_token_length, "desired_name": name, "weight": weight,
            "group_size": group_size, "min_batch_allocation": min_batch_allocation}
    response = (await c.post("/register-env", json=body)).json()
    assert response["status"] == "success", response
    return response["env_id"]
