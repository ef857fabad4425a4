"""Arithmetic env: split, scoring, and the group contract through check_env + FakeServer."""

import random
import re
from pathlib import Path

import pytest

from atroposlib.env_runtime.checks import check_env
from atroposlib.environments.arithmetic_server import (
    DIFFICULTIES,
    ArithmeticEnv,
    heldout_problems,
    is_heldout,
    make_problem,
    score_reply,
)
from atroposlib.testing.fake_server import FakeServer

BUNDLED = Path.home() / ".cache" / "atroposlib" / "bundled" / "SmolLM2-135M-Instruct"
needs_tokenizer = pytest.mark.skipif(not (BUNDLED / "tokenizer.json").exists(),
                                     reason="bundled model not prepared (atropos-bundled-model)")


@pytest.mark.parametrize("difficulty", sorted(DIFFICULTIES))
def test_train_and_heldout_splits_never_overlap(difficulty):
    rng = random.Random(0)
    train = {(p["a"], p["op"], p["b"]) for p in (make_problem(rng, difficulty, False, 0.25) for _ in range(300))}
    held = {(p["a"], p["op"], p["b"]) for p in heldout_problems(difficulty, 0.25, 10_000, 1)}
    assert held and train and not train & held
    for a, op, b in held:
        assert is_heldout(a, op, b, 0.25)


def test_eval_set_is_distinct_seeded_and_answers_are_right():
    items = heldout_problems(2, 0.25, 50, seed=7)
    assert len(items) == 50 == len({(p["a"], p["b"]) for p in items})
    assert items == heldout_problems(2, 0.25, 50, seed=7)
    assert items != heldout_problems(2, 0.25, 50, seed=8)
    for p in heldout_problems(5, 0.25, 100, 0):
        assert p["answer"] == eval(f"{p['a']} {p['op']} {p['b']}")
        assert p["answer"] >= 0
    with pytest.raises(ValueError, match="difficulty"):
        heldout_problems(9, 0.25, 5, 0)


def test_score_reply_needs_right_last_number_and_a_natural_stop():
    assert score_reply("20", 20, "stop") == 1.0
    assert score_reply("1 + 19 = 20", 20, "stop") == 1.0
    assert score_reply("4 + 16 = 18", 20, "stop") == 0.0
    assert score_reply("1 + 19 = 20 and then", 20, "length") == 0.0
    assert score_reply("twenty", 20, "stop") == 0.0


@needs_tokenizer
async def test_check_env_groups_have_exact_tokens_logprobs_and_scores():
    def reply(request):
        # right answer for even choices, wrong for odd ones: mixed scores within a group
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", request.prompt)[-1])
        return str(a + b) if request.index % 2 == 0 else str(a + b + 1)

    server = FakeServer(reply)
    groups = await check_env(ArithmeticEnv, server=server,
                             config_overrides={"tokenizer_name": str(BUNDLED), "group_size": 4},
                             num_groups=2)
    for group in groups:
        assert group["scores"] == [1.0, 0.0, 1.0, 0.0]
        assert group["generation_params"] == {"temperature": 1.0}
        assert len(group["inference_logprobs"][0]) == len(group["tokens"][0])


@needs_tokenizer
async def test_groups_carry_the_reference_answer_that_the_rollout_views_show():
    """SingleTurnEnv puts ``answer(item)`` in ``group_overrides``, which run-api keeps and serves."""
    from atroposlib.frontend.render import reference_answer, render_group_html

    def reply(request):
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", request.prompt)[-1])
        return str(a + b)

    groups = await check_env(ArithmeticEnv, server=FakeServer(reply),
                             config_overrides={"tokenizer_name": str(BUNDLED), "group_size": 2,
                                               "include_messages": True},
                             num_groups=2)
    for group in groups:
        question = group["messages"][0][-2]["content"]
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", question)[-1])
        assert group["group_overrides"]["reference_answer"] == str(a + b)
        assert reference_answer(group) == str(a + b)
        page = render_group_html(group, title="g")
        assert "reference answer" in page and str(a + b) in page.split("reference answer", 1)[1]
