"""OpenEnv environment servers (openenv-core 0.3) as Atropos envs, against the fake model server."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("openenv")

from atroposlib.adapters import adapter_env_class  # noqa: E402
from atroposlib.adapters.openenv import LocalServer, parse_action  # noqa: E402
from atroposlib.api.models import IGNORE_INDEX  # noqa: E402
from atroposlib.errors import ConfigError  # noqa: E402
from atroposlib.testing.fake_server import FakeServer  # noqa: E402

APP = "tests.adapters.openenv_word.server:app"


def asked_word(request) -> str:
    return request.prompt.rsplit("Say the word ", 1)[-1].split('"', 1)[0]


def run_group(spec, tok_dir, tok, reply, **config):
    cls = adapter_env_class(f"openenv:{spec}")
    cfg = cls.env_config_cls(**{"tokenizer_name": tok_dir, "use_wandb": False, "group_size": 2,
                                "max_tokens": 16, **config})
    env = cls(cfg, [FakeServer(reply, tokenizer=tok)])

    async def run():
        await env.setup()
        try:
            return await env.collect_trajectories(await env.get_next_item())
        finally:
            env.close_server()

    group, _ = asyncio.run(run())
    return env, group


def test_started_server_one_episode_per_rollout(tiny_tok_dir, tiny_tok):
    env, group = run_group(APP, tiny_tok_dir, tiny_tok, asked_word)
    assert env.name == "openenv-openenv_word"
    assert group["scores"] == [2.0, 2.0]  # both steps said the asked word
    for tokens, masks in zip(group["tokens"], group["masks"], strict=True):
        text = tiny_tok.decode(tokens)
        assert '{"prompt": "Say the word apple"}' in text and "Say the word river" in text
        trained = tiny_tok.decode([t for t, m in zip(tokens, masks, strict=True)
                                   if m != IGNORE_INDEX], skip_special_tokens=True)
        assert trained == "appleriver"  # the two actions; observations are masked


def test_running_server_by_url_and_invalid_actions(tiny_tok_dir, tiny_tok):
    server = LocalServer(APP)
    url = server.start()
    try:
        replies = iter(['{"wrong": 1}', "apple", "nope", '{"message": "x"}', "apple", "nope"])
        env, group = run_group(url, tiny_tok_dir, tiny_tok, lambda r: next(replies),
                               group_size=1, invalid_action_penalty=-0.5)
    finally:
        server.stop()
    # an extra field is rejected by the server: -0.5, then apple (1.0), then nope (0.0)
    assert group["scores"] == [0.5]
    assert env.stats["rollouts_returned_none"] == 0


def test_started_server_stops(tiny_tok_dir, tiny_tok):
    server = LocalServer(APP)
    server.start()
    process = server.process
    server.stop()
    assert process.poll() is not None and server.process is None


def test_parse_action():
    schema = {"required": ["message"]}
    assert parse_action("hi there", schema) == {"message": "hi there"}
    assert parse_action('```json\n{"message": "x"}\n```', schema) == {"message": "x"}
    with pytest.raises(ValueError, match="JSON object"):
        parse_action("go", {"required": ["a", "b"]})


def test_bad_specs():
    with pytest.raises(ConfigError, match="module:app"):
        adapter_env_class("openenv:echo_env")
    with pytest.raises(ConfigError, match="exited"):
        LocalServer("no_such_module_here:app").start(timeout=30)
