"""Arithmetic env: split, scoring, and the group contract through check_env + FakeServer."""

import math
import random
import re

import pytest

from atroposlib.env_runtime.checks import check_env
from atroposlib.environments.arithmetic_server import (
    CURRICULUM_MIN_OPERAND,
    DIFFICULTIES,
    ArithmeticEnv,
    ArithmeticEnvConfig,
    column_carries,
    curriculum_update,
    digit_credit,
    heldout_problems,
    is_heldout,
    make_problem,
    problem_features,
    problem_shape,
    score_reply,
)
from atroposlib.envs.run_state import RunState
from atroposlib.inference.bundled import bundled_model_dir
from atroposlib.testing.fake_server import FakeServer

BUNDLED = bundled_model_dir()
# The session fixture builds the bundled model when it is missing (a fresh machine), so
# these tests run there rather than skip.
needs_tokenizer = pytest.mark.usefixtures("bundled_model_dir")


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


def test_curriculum_update_follows_the_reward_within_bounds():
    # AdaRFT: T + eta * tanh(alpha * (R - beta)), clipped
    assert curriculum_update(20, 0.75, 0.5, 1.0, 9, 99) == pytest.approx(20 + math.tanh(0.5))
    assert curriculum_update(20, 0.5, 0.5, 1.0, 9, 99) == 20
    assert curriculum_update(20, 0.0, 0.5, 1.0, 9, 99) == pytest.approx(20 - math.tanh(1.0))
    assert curriculum_update(98.9, 1.0, 0.5, 1.0, 9, 99) == 99
    assert curriculum_update(9.2, 0.0, 0.5, 1.0, 9, 99) == 9


def test_make_problem_keeps_operands_under_the_target_and_out_of_the_heldout_split():
    rng = random.Random(0)
    problems = [make_problem(rng, 4, False, 0.25, max_operand=15) for _ in range(300)]
    assert max(max(p["a"], p["b"]) for p in problems) == 15
    assert {p["op"] for p in problems} == {"+", "-"}
    assert not any(is_heldout(p["a"], p["op"], p["b"], 0.25) for p in problems)
    low = [make_problem(rng, 4, False, 0.25, max_operand=2) for _ in range(100)]
    assert max(max(p["a"], p["b"]) for p in low) == CURRICULUM_MIN_OPERAND  # the floor


@needs_tokenizer
async def test_the_curriculum_widens_while_groups_are_solved_and_narrows_while_they_fail():
    solve = {"on": True}

    def reply(request):
        a, op, b = re.findall(r"What is (\d+) ([+-]) (\d+)\?", request.prompt)[-1]
        answer = int(a) + int(b) if op == "+" else int(a) - int(b)
        return str(answer if solve["on"] else answer + 1)

    config = ArithmeticEnvConfig(**{**ArithmeticEnv.config_init()[0].model_dump(), "use_wandb": False,
                                    "tokenizer_name": str(BUNDLED), "group_size": 4, "difficulty": 4,
                                    "curriculum": True, "curriculum_start": 20, "curriculum_step": 2.0})
    env = ArithmeticEnv(config, [FakeServer(reply)])
    await env.setup()
    assert env.max_operand == 20
    seen = []
    for _ in range(10):
        item = await env.get_next_item()
        seen.append((max(item["a"], item["b"]), round(env.max_operand)))
        await env.collect_trajectories(item)
    assert env.max_operand == pytest.approx(20 + 10 * 2.0 * math.tanh(1.0))  # every group solved
    assert all(operand <= bound for operand, bound in seen)
    solve["on"] = False
    for _ in range(5):
        await env.collect_trajectories(await env.get_next_item())
    assert env.max_operand == pytest.approx(20 + 5 * 2.0 * math.tanh(1.0))
    # held-out problems keep the whole range
    assert max(max(p["a"], p["b"]) for p in env.eval_items) > 90


@needs_tokenizer
async def test_a_restarted_env_resumes_the_curriculum_from_its_checkpoint(tmp_path):
    def env_at(step: int, **overrides) -> ArithmeticEnv:
        config = ArithmeticEnvConfig(**{
            **ArithmeticEnv.config_init()[0].model_dump(), "use_wandb": False,
            "tokenizer_name": str(BUNDLED), "difficulty": 4, "curriculum": True, **overrides})
        env = ArithmeticEnv(config, [FakeServer()])
        env.bind_run_state(RunState.for_config(config, checkpoint_dir=str(tmp_path),
                                               wandb_prepend="arithmetic_0", curr_step=step))
        return env

    first = env_at(0)
    await first.setup()
    first.max_operand, first.iter = 57.25, 12
    first.save_checkpoint(10)
    restarted = env_at(15)
    await restarted.setup()
    assert restarted.max_operand == 20  # curriculum_start, before the checkpoint is read
    restarted.load_checkpoint()
    assert (restarted.max_operand, restarted.iter) == (57.25, 12)
    narrower = env_at(15, difficulty=3)  # a smaller range now: the target is clipped to it
    await narrower.setup()
    narrower.load_checkpoint()
    assert narrower.max_operand == DIFFICULTIES[3][1]
    off = env_at(15, curriculum=False)  # the curriculum turned off: the saved target is ignored
    await off.setup()
    off.load_checkpoint()
    assert off.max_operand is None and off.iter == 12


@pytest.mark.parametrize(("a", "op", "b", "shape"), [
    (12, "+", 34, "2+2 c00"), (17, "+", 5, "2+1 c10"), (75, "+", 31, "2+2 c01"),
    (95, "+", 5, "2+1 c11"), (4, "+", 3, "1+1 c00"), (8, "+", 9, "1+1 c10"),
    (57, "-", 23, "2-2 b00"), (52, "-", 7, "2-1 b10"), (30, "-", 25, "2-2 b10"),
    (14, "-", 9, "2-1 b10"), (9, "-", 4, "1-1 b00"), (23, "*", 4, "2*1"),
])
def test_problem_shape_names_digits_and_carries(a, op, b, shape):
    assert problem_shape(a, op, b) == shape


def test_shape_classes_recur_where_problems_do_not():
    rng = random.Random(0)
    problems = [make_problem(rng, 4, False, 0.25) for _ in range(2000)]
    shapes = {problem_shape(p["a"], p["op"], p["b"]) for p in problems}
    distinct = {(p["a"], p["op"], p["b"]) for p in problems}
    assert 14 <= len(shapes) <= 17 and len(distinct) > 1500
    for p in problems:  # the flags, checked against the answer's digits
        flags = problem_shape(p["a"], p["op"], p["b"]).split()[1]
        if p["op"] == "+":  # a units carry leaves a smaller units digit; a tens carry, 3 digits
            assert flags == f"c{p['answer'] % 10 < p['a'] % 10:d}{p['answer'] >= 100:d}"
        else:  # a units borrow leaves a larger units digit; operands < 100 never borrow twice
            assert flags == f"b{p['answer'] % 10 > p['a'] % 10:d}0"


@pytest.mark.parametrize("by", ["problem", "shape"])
def test_item_id_follows_difficulty_filter_by(by):
    config = ArithmeticEnvConfig(**{**ArithmeticEnv.config_init()[0].model_dump(), "use_wandb": False,
                                    "difficulty": 4, "difficulty_filter_by": by})
    env = ArithmeticEnv(config, [FakeServer()])
    one, other = ({"a": 17, "op": "+", "b": 5}, {"a": 28, "op": "+", "b": 3})  # same shape
    same = env.item_id(one) == env.item_id(other)
    assert same == (by == "shape")
    assert env.item_id(one) == env.item_id(dict(one))


@pytest.mark.parametrize(("a", "op", "b", "carries"), [
    (17, "+", 5, 1), (95, "+", 7, 2), (99, "+", 99, 2), (12, "+", 3, 0), (999, "+", 1, 3),
    (52, "-", 7, 1), (100, "-", 1, 2), (87, "-", 49, 1), (58, "-", 23, 0),
    (23, "*", 4, 1), (29, "*", 29, 3), (12, "*", 3, 0),
])
def test_column_carries_counts_carries_borrows_and_carrying_products(a, op, b, carries):
    assert column_carries(a, op, b) == carries


def test_problem_features_describe_what_makes_a_problem_hard():
    import math

    features = problem_features(95, "+", 7)
    assert features == {
        "op_add": 1.0, "op_sub": 0.0, "op_mul": 0.0, "a_digits": 2.0, "b_digits": 1.0,
        "a_log10": math.log10(96), "b_log10": math.log10(8), "carries": 2.0, "answer_digits": 3.0,
        "answer_negative": 0.0, "answer_log10": math.log10(103), "equal_operands": 0.0,
        "zero_digits": 0.0}
    assert problem_features(7, "-", 30)["answer_negative"] == 1.0
    assert problem_features(20, "*", 20)["zero_digits"] == 2.0
    assert problem_features(20, "*", 20)["equal_operands"] == 1.0
    config = ArithmeticEnvConfig(**{**ArithmeticEnv.config_init()[0].model_dump(), "use_wandb": False})
    env = ArithmeticEnv(config, [FakeServer()])
    rng = random.Random(0)
    for _ in range(200):  # every difficulty's problems: 13 finite features, the answer never read
        problem = make_problem(rng, rng.randint(1, 5), False, 0.25)
        described = env.item_features(problem)
        assert len(described) == 13 and all(math.isfinite(v) for v in described.values())
        assert described == env.item_features({**problem, "answer": None, "question": ""})


@pytest.mark.parametrize(("final", "answer", "credit"), [
    ("57", 57, 1.0), ("47", 57, 0.5), ("157", 57, 2 / 3), ("75", 57, 0.0), ("7", 57, 0.5),
    ("-57", 57, 0.0), ("-13", -23, 0.5), ("57.5", 57, 0.0), (None, 57, 0.0), ("0", 0, 1.0),
])
def test_digit_credit_matches_places_from_the_ones(final, answer, credit):
    assert digit_credit(final, answer) == pytest.approx(credit)


@needs_tokenizer
async def test_partial_credit_ranks_an_all_wrong_group_and_leaves_accuracy_exact():
    """With partial credit, wrong replies score between 0 and the credit by their digits (so a
    group's wrong replies are no longer all 0), a right reply still scores 1, and without it a
    near miss scores 0."""
    def reply(request):
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", request.prompt)[-1])
        return str(a + b + (10, 1, 100, 0)[request.index % 4])  # tens wrong, ones wrong, 3 digits, right

    overrides = {"tokenizer_name": str(BUNDLED), "group_size": 4, "partial_credit": 0.3}
    groups = await check_env(ArithmeticEnv, server=FakeServer(reply), config_overrides=overrides,
                             num_groups=2)
    for group in groups:
        off_by_ten, off_by_one, off_by_hundred, right = group["scores"]
        assert right == 1.0
        assert 0.0 < off_by_hundred <= 0.3 and 0.0 <= off_by_one <= 0.3 and 0.0 <= off_by_ten <= 0.3
        assert len(set(group["scores"])) > 1

    config = ArithmeticEnvConfig(**{**ArithmeticEnv.config_init()[0].model_dump(), "use_wandb": False,
                                    "partial_credit": 0.3})
    env = ArithmeticEnv(config, [FakeServer()])
    item = {"a": 47, "op": "+", "b": 10, "answer": 57, "question": "What is 47 + 10?"}
    assert env.score(item, "57") == 1.0
    assert env.score(item, "The answer is 47.") == pytest.approx(0.15)
    assert env.score(item, "no idea") == 0.0
    exact = ArithmeticEnv(ArithmeticEnvConfig(**{**config.model_dump(), "partial_credit": 0.0}),
                          [FakeServer()])
    assert exact.score(item, "The answer is 47.") == 0.0


@needs_tokenizer
def test_the_screens_reference_reply_is_the_working_then_the_result():
    """The difficulty screen scores the result's tokens (and the end of turn) after the working."""
    from atroposlib.envs.single_turn import SingleTurnEnv, _reply_tokens

    config = ArithmeticEnvConfig(**{**ArithmeticEnv.config_init()[0].model_dump(), "use_wandb": False,
                                    "tokenizer_name": str(BUNDLED)})
    env = ArithmeticEnv(config, [FakeServer()])
    item = {"a": 87, "op": "-", "b": 49, "answer": 38, "question": "What is 87 - 49? Answer with just the number."}
    assert env.reference_reply(item) == ("87 - 49 =", " 38")
    prompt_ids, reply_ids, start = _reply_tokens(env.tokenizer, env.prompt(item), *env.reference_reply(item))
    assert env.tokenizer.decode(prompt_ids).endswith("assistant\n")
    assert env.tokenizer.decode(reply_ids[:start]) == "87 - 49 ="
    assert env.tokenizer.decode(reply_ids[start:]) == " 38<|im_end|>"
    # SingleTurnEnv's own reference reply is the bare answer: every reply token is scored
    assert SingleTurnEnv.reference_reply(env, item) == ("", "38")
    assert _reply_tokens(env.tokenizer, env.prompt(item), "", "38")[2] == 0
    # a working whose last token merges with the answer's first cannot be split: no signal
    assert _reply_tokens(env.tokenizer, env.prompt(item), "hello wor", "ld") is None
