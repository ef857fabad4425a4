"""Any Gymnasium environment by id, played in text (``gym:ID``), against the fake server."""

from __future__ import annotations

import asyncio

import pytest

from atroposlib.adapters import adapter_env_class
from atroposlib.api.models import IGNORE_INDEX
from atroposlib.errors import ConfigError
from atroposlib.testing.fake_server import FakeServer

# FrozenLake 4x4 without slipping: from S (0) down, down, right, right, down, right reaches G.
WINNING = ["down", "down", "right", "right", "down", "right"]


def play(gym_id, tok_dir, tok, replies, **config):
    cls = adapter_env_class(f"gym:{gym_id}")
    cfg = cls.env_config_cls(**{"tokenizer_name": tok_dir, "use_wandb": False, "group_size": 2,
                                **config})
    env = cls(cfg, [FakeServer(replies, tokenizer=tok)])

    async def run():
        await env.setup()
        return await env.collect_trajectories(await env.get_next_item())

    group, _ = asyncio.run(run())
    return env, group


def test_frozen_lake_by_id_scores_the_episode_return(tiny_tok_dir, tiny_tok):
    replies = iter(["I go down"] + WINNING[1:] + ["left"] * 20)
    env, group = play("FrozenLake-v1", tiny_tok_dir, tiny_tok, lambda r: next(replies),
                      gym_kwargs={"is_slippery": False}, max_turns=10, group_size=1,
                      action_names=["left", "down", "right", "up"])
    assert env.name == "gym-frozenlake_v1"
    assert group["scores"] == [1.0]
    tokens, masks = group["tokens"][0], group["masks"][0]
    text = tiny_tok.decode(tokens)
    assert "SFFF" in text and "Observation: 0" in text and "Observation: 14" in text
    trained = tiny_tok.decode([t for t, m in zip(tokens, masks, strict=True) if m != IGNORE_INDEX],
                              skip_special_tokens=True)
    assert trained == "I go down" + "".join(WINNING[1:])  # only the model's replies train


def test_numbers_are_the_default_actions_and_bad_replies_cost(tiny_tok_dir, tiny_tok):
    def reply(request):
        return "0" if "Invalid reply" in request.prompt else "none of these"

    _, group = play("CliffWalking-v1", tiny_tok_dir, tiny_tok, reply, max_turns=2,
                    invalid_action_penalty=-0.5)
    # one invalid reply (-0.5) then action 0 (up: -1 per step)
    assert sorted(group["scores"]) == [-1.5, -1.5]


def test_unknown_or_unplayable_ids_are_clear_errors():
    with pytest.raises(ConfigError, match="did you mean FrozenLake"):
        adapter_env_class("gym:FrozenLak-v1")
    with pytest.raises(ConfigError, match="action space is Box"):
        adapter_env_class("gym:Pendulum-v1")


def test_action_names_must_match_the_action_count(tiny_tok_dir, tiny_tok):
    cls = adapter_env_class("gym:FrozenLake-v1")
    cfg = cls.env_config_cls(tokenizer_name=tiny_tok_dir, use_wandb=False, action_names=["a"])
    with pytest.raises(ConfigError, match="4 actions"):
        cls(cfg, [FakeServer(["x"], tokenizer=tiny_tok)])
