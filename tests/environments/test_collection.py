"""Every environment of the collection passes check_env against the in-process FakeServer."""

from __future__ import annotations

import itertools
import re

import pytest

from atroposlib.envs.checks import check_env
from atroposlib.testing.fake_server import FakeServer


def _cycle(*replies):
    it = itertools.cycle(replies)
    return lambda _req: next(it)


def _letter_reply(req):
    m = re.search(r"letter '(.)' appear in the word '(\w+)'", req.prompt)
    right = m.group(2).count(m.group(1))
    return [f"<answer>{right}</answer>", f"I count {right}", "<answer>99</answer>"][req.index % 3]


def _reversal_reply(req):
    text = re.search(r"Reverse this text: (.+)", req.prompt).group(1).strip()
    return [f"<answer>{text[::-1]}</answer>", f"<answer>{text}</answer>", "no idea"][req.index % 3]


def _env(module: str, cls: str):
    import importlib

    return getattr(importlib.import_module(f"environments.{module}"), cls)


CASES = {
    "letter_counting": ("letter_counting_env", "LetterCountingEnv", _letter_reply, {}),
    "text_reversal": ("text_reversal_env", "TextReversalEnv", _reversal_reply, {}),
    "blackjack": ("blackjack_env", "BlackjackEnv", _cycle("hit", "stick", "I stick", "?", "stand"), {}),
    "taxi": ("taxi_env", "TaxiEnv", _cycle("north", "pickup", "west", "dance"), {"max_turns": 4}),
}


@pytest.mark.parametrize("name", sorted(CASES))
async def test_check_env(name, tok_dir, request):
    module, cls, reply, overrides = CASES[name]
    env_cls = _env(module, cls)
    extra = request.getfixturevalue(f"{name}_overrides") if f"{name}_overrides" in request.fixturenames else {}
    groups = await check_env(
        env_cls, FakeServer(reply),
        {"tokenizer_name": tok_dir, "group_size": 3, **overrides, **extra}, num_groups=2,
    )
    assert len(groups) == 2
    for group in groups:
        assert group["inference_logprobs"] is not None or group.get("images") is not None
        assert len(group["messages"]) == 3
