"""Behaviour of the collection's environments: scoring rules, multi-turn masks, data handling."""

from __future__ import annotations

import base64
import io
import itertools
import json
import random

import pytest

from atroposlib.api.models import IGNORE_INDEX
from atroposlib.env_runtime.checks import check_env
from atroposlib.errors import ConfigError, RolloutError
from atroposlib.testing.fake_server import FakeServer
from tests.environments.test_collection import data_files, env_class  # noqa: F401 - fixture


async def make_env(name, tok_dir, reply, **overrides):
    """Build and set up an env bound to a FakeServer (like check_env, but returns the env)."""
    cls = env_class(name)
    cfg, _ = cls.config_init()
    config = cls.env_config_cls(**{**cfg.model_dump(), "use_wandb": False,
                                   "tokenizer_name": tok_dir, **overrides})
    server = FakeServer(reply)
    env = cls(config, [server])
    await env.setup()
    return env, server


def trained_text(env, tokens, masks) -> str:
    return env.tokenizer.decode([t for t, m in zip(tokens, masks, strict=True) if m != IGNORE_INDEX])


# ------------------------------------------------------------------ letter counting / reversal
def test_letter_counting_scoring_and_generator():
    from atroposlib.environments.letter_counting_env import make_question, score_answer

    rng = random.Random(1)
    items = [make_question(rng, 5, 9, 2) for _ in range(50)]
    for item in items:
        assert 5 <= len(item["word"]) <= 9 and len(set(item["letters"])) == 2
        assert item["counts"] == [item["word"].count(ch) for ch in item["letters"]]
    assert any(c > 1 for item in items for c in item["counts"])
    assert score_answer("<answer>2, 0</answer>", [2, 0]) == 1.0
    assert score_answer("<answer>2</answer>", [2, 0]) == 0.0
    assert score_answer("so 2 and 0", [2, 0]) == 0.5
    assert score_answer("", [1]) == 0.0


def test_text_reversal_partial_credit():
    from atroposlib.environments.text_reversal_env import score_reversal

    assert score_reversal("<answer>olleh</answer>", "olleh", True) == 1.0
    near = score_reversal("<answer>olleg</answer>", "olleh", True)
    assert 0.0 < near < 0.5
    assert score_reversal("<answer>olleg</answer>", "olleh", False) == 0.0
    assert score_reversal("olleh", "olleh", True) == 0.0  # no tags, no credit


# ------------------------------------------------------------------ dataset env
async def test_dataset_env_scores_with_registry_rewards(tok_dir, data_files):  # noqa: F811
    replies = itertools.cycle(["\\boxed{2}", "\\boxed{3}", "<think>1+1</think><answer>\\boxed{2}</answer>"])
    env, _ = await make_env(
        "dataset", tok_dir, lambda r: next(replies), dataset_name=data_files["qa"],
        shuffle=False, group_size=3, reward_funcs=["accuracy", {"type": "format", "weight": 0.5}],
    )
    item = await env.get_next_item()
    assert item == {"prompt": "What is 1 + 1?", "answer": "2"}
    group, _ = await env.collect_trajectories(item)
    assert group["scores"] == [1.0, 0.0, 1.5]  # accuracy + 0.5 * format(think, answer)
    metrics = await env.evaluate()
    assert metrics["eval/num_items"] == 5.0  # eval falls back to the same local file


async def test_dataset_env_failing_reward_raises_not_zero(tok_dir, data_files, tmp_path):  # noqa: F811
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": ""}) + "\n")  # no reference answer
    env, _ = await make_env("dataset", tok_dir, lambda r: "\\boxed{1}", dataset_name=str(bad),
                            answer_regex=None, group_size=2)
    with pytest.raises(RolloutError, match="could not parse the solution"):
        await env.collect_trajectories(await env.get_next_item())


async def test_dataset_env_missing_data_is_a_clear_config_error(tok_dir, tmp_path):
    with pytest.raises(ConfigError, match="--env.dataset_name PATH"):
        await make_env("dataset", tok_dir, None, dataset_name=str(tmp_path / "nope" / "x"))
    bad_field = tmp_path / "f.jsonl"
    bad_field.write_text(json.dumps({"q": "x", "answer": "1"}) + "\n")
    with pytest.raises(KeyError, match="--env.prompt_field"):
        await make_env("dataset", tok_dir, None, dataset_name=str(bad_field))


# ------------------------------------------------------------------ MCQA
def test_mcqa_row_normalisation_and_letter_parsing():
    from atroposlib.environments.mcqa_env import normalise_row, parse_letter

    row = normalise_row({"question": "q", "A": "x", "B": "y", "C": "z", "answer": "c"},
                        "question", "choices", "answer")
    assert row == {"question": "q", "choices": ["x", "y", "z"], "answer": 2}
    row = normalise_row({"question": "q", "choices": '["a", "b"]', "answer": 1},
                        "question", "choices", "answer")
    assert row["choices"] == ["a", "b"] and row["answer"] == 1
    with pytest.raises(ValueError, match="out of range"):
        normalise_row({"question": "q", "choices": ["a", "b"], "answer": 5}, "question", "choices", "answer")
    assert parse_letter("<answer>B</answer>", 4) == "B"
    assert parse_letter("<answer>(C) because</answer>", 4) == "C"
    assert parse_letter("<answer>E</answer>", 4) is None
    assert parse_letter("I think the answer is D.", 4) == "D"
    assert parse_letter("A B C D", 4) is None


async def test_mcqa_truncated_reply_scores_zero(tok_dir, data_files):  # noqa: F811
    replies = itertools.cycle([("<answer>B</answer>", "stop"), ("<answer>B</answer>" + " ..." * 50, "stop"),
                               "<answer>A</answer>"])
    env, _ = await make_env("mcqa", tok_dir, lambda r: next(replies), dataset_name=data_files["mc"],
                            group_size=3, max_tokens=20)
    group, _ = await env.collect_trajectories(await env.get_next_item())
    assert group["scores"] == [1.0, 0.0, 0.0]  # the second one hit max_tokens


# ------------------------------------------------------------------ games
async def test_blackjack_episode_trains_every_turn_and_scores_the_return(tok_dir):
    import gymnasium

    replies = itertools.cycle(["I will hit", "hmm, dance", "hit", "stick"])
    env, server = await make_env("blackjack", tok_dir, lambda r: next(replies), group_size=1,
                                 max_turns=6, invalid_action_penalty=-0.25)
    episode, score, stats = await env.play(123, temperature=1.0)
    # replay the same actions in gymnasium from the same seed
    game = gymnasium.make("Blackjack-v1", natural=False, sab=False)
    game.reset(seed=123)
    expected, invalid = 0.0, 0
    for message in episode.messages:
        if message["role"] != "assistant":
            continue
        action = env.parse_action(message["content"])
        if action is None:
            invalid += 1
            continue
        _, reward, terminated, truncated, _ = game.step(action)
        expected += reward
        if terminated or truncated:
            break
    assert score == pytest.approx(expected - 0.25 * invalid)
    assert stats["invalid"] == invalid
    assert episode.contiguous
    assistant_turns = [m["content"] for m in episode.messages if m["role"] == "assistant"]
    trained = trained_text(env, episode.node.tokens, episode.node.masked_tokens)
    assert trained == "".join(t + "<|im_end|>" for t in assistant_turns)
    assert len(server.requests) == len(assistant_turns)


async def test_blackjack_group_shares_the_seed(tok_dir):
    env, _ = await make_env("blackjack", tok_dir, lambda r: "stick", group_size=3)
    group, _ = await env.collect_trajectories(await env.get_next_item())
    openings = {json.dumps(m[1]) for m in group["messages"]}
    assert len(openings) == 1 and len(set(group["scores"])) == 1


async def test_taxi_describes_the_board_and_counts_moves(tok_dir):
    env, _ = await make_env("taxi", tok_dir, lambda r: "north", group_size=1, max_turns=3)
    episode, score, stats = await env.play(7, temperature=1.0)
    first = episode.messages[1]["content"]
    assert "T" in first.split("The taxi")[0] and "destination is stop" in first
    assert stats["turns"] == 3 and stats["finished"] == 0.0
    assert score == -3.0  # three legal (or wall-bumping) moves cost 1 each


async def test_taxi_episode_stops_before_overflowing_the_context(tok_dir):
    env, server = await make_env("taxi", tok_dir, lambda r: "west", group_size=1, max_turns=10,
                                 max_tokens=8, max_token_length=1500)
    episode, _, stats = await env.play(7, temperature=1.0)
    assert episode.out_of_context and stats["out_of_context"] == 1.0
    assert 1 <= episode.turns < 10
    assert len(episode.node.tokens) < 1500  # the API's length filter would keep this group


# ------------------------------------------------------------------ tool calling
def test_tool_call_matching():
    from atroposlib.environments.tool_calling_env import builtin_example, score_tool_calls

    expected = [{"name": "f", "arguments": {"x": 1, "y": "a"}}, {"name": "g", "arguments": {}}]
    both = ('<tool_call>{"name": "g", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "f", "arguments": "{\\"y\\": \\"a\\", \\"x\\": 1.0}"}</tool_call>')
    assert score_tool_calls(both, expected) == 1.0
    assert score_tool_calls(both.split("</tool_call>")[0] + "</tool_call>", expected) == -1.0
    assert score_tool_calls(both + "<tool_call>{oops</tool_call>", expected) == -1.0
    assert score_tool_calls("no calls", []) == 1.0
    example = builtin_example(random.Random(3))
    assert {"query", "tools", "answers"} <= set(example)


async def test_tool_calling_builtin_dataset_splits_train_and_eval(tok_dir):
    from atroposlib.environments.tool_calling_env import builtin_example

    # 200 generated rows repeat requests (the generator has a small space): with this seed 4
    # training rows repeat one of the 10 eval requests
    env, _ = await make_env("tool_calling", tok_dir, None, dataset_name="builtin", builtin_size=200)
    assert len(env.eval_items) == 10
    eval_queries = {i["query"] for i in env.eval_items}
    train_queries = {i["query"] for i in env.train_items}
    assert not eval_queries & train_queries  # no eval request is trained on
    # and nothing else is lost: every generated request is in one split or the other
    rng = random.Random(env.config.seed)
    generated = {builtin_example(rng)["query"] for _ in range(200)}
    assert train_queries | eval_queries == generated
    assert len(env.train_items) == 190 - 4


# ------------------------------------------------------------------ calculator tool loop
def test_calculator_is_safe_and_exact():
    from atroposlib.environments.calculator_env import calculate, final_answer, format_number

    assert calculate("347*29 + 1200/16") == 10138
    assert format_number(calculate("1/3")) == "0.333333"
    for bad in ("__import__('os').system('x')", "9**9**9", "1/0", "[1]*10", "a"):
        with pytest.raises(ValueError):
            calculate(bad)
    assert final_answer("<answer>1,234</answer>") == 1234
    assert final_answer("\\boxed{7}") == 7
    assert final_answer("seven") is None


async def test_calculator_loop_feeds_tool_results_back(tok_dir):
    from tests.environments.test_collection import _calculator_reply

    env, server = await make_env("calculator", tok_dir, _calculator_reply, group_size=1, max_turns=3)
    item = {"question": "A shop sells 12 boxes of 34 pens and has 100 loose pens. How many pens in total?",
            "answer": 12 * 34 + 100}
    episode, score, stats = await env.solve(item, temperature=1.0)
    roles = [m["role"] for m in episode.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert episode.messages[3]["content"] == "508" and score == 1.0 and stats["tool_calls"] == 1
    trained = trained_text(env, episode.node.tokens, episode.node.masked_tokens)
    assert "calculator" in trained and "<answer>508</answer>" in trained and "508<|im_end|>\n<|im_start|>" not in trained
    # a wrong final answer scores -1
    wrong, _ = await make_env("calculator", tok_dir, lambda r: "<answer>1</answer>", group_size=1)
    _, score, stats = await wrong.solve(item, temperature=1.0)
    assert score == -1.0 and stats["tool_calls"] == 0
    # the recorded transcript alone gives the same reward (what atropos-replay rescore runs)
    assert env.score_episode(item, episode.messages) == 1.0
    bonus, _ = await make_env("calculator", tok_dir, _calculator_reply, group_size=1, tool_use_bonus=0.5)
    assert bonus.score_episode(item, episode.messages) == 1.5
    unanswered = episode.messages[:4]  # ended on the tool's result: no final answer
    assert bonus.score_episode(item, unanswered) == -1.0
    direct = [*episode.messages[:2], {"role": "assistant", "content": "<answer>508</answer>"}]
    assert bonus.score_episode(item, direct) == 1.0  # right, but no tool call: no bonus


# ------------------------------------------------------------------ judge
@pytest.mark.parametrize("prefill", [True, False])
async def test_judge_rubric_scores_follow_the_judge(tok_dir, prefill):
    from tests.environments.test_collection import _judge_reply

    env, server = await make_env("judge", tok_dir, _judge_reply, group_size=2, judge_prefill=prefill)
    group, _ = await env.collect_trajectories(await env.get_next_item())
    assert group["scores"] == pytest.approx([8 / 9, 1 / 9])
    judge_calls = [r for r in server.requests if "strict judge" in r.prompt]
    assert len(judge_calls) == 2 and all(r.kwargs["max_tokens"] == 16 for r in judge_calls)
    # prefill: the judge continues its own templated reply after "Score:" (completion API)
    assert {r.kind for r in judge_calls} == ({"completion"} if prefill else {"chat"})
    if prefill:
        assert all(r.prompt.endswith("<|im_start|>assistant\nScore:") for r in judge_calls)


async def test_judge_pairwise_win_rates_cancel_position_bias(tok_dir):
    def reply(req):
        if "RESPONSE A" in req.prompt:
            a = req.prompt.split("RESPONSE A:\n")[1].split("\n\nRESPONSE B")[0]
            return "\\boxed{A}" if a == "best" else "\\boxed{B}" if "RESPONSE B:\nbest" in req.prompt else "\\boxed{A}"
        return ["best", "meh", "meh2"][req.index % 3]

    env, server = await make_env("judge", tok_dir, reply, group_size=3, mode="pairwise")
    group, _ = await env.collect_trajectories(await env.get_next_item())
    assert group["scores"][0] == 1.0  # "best" wins all 4 of its games
    # the other two: each wins the game where it is A against the other -> 1 of 4
    assert group["scores"][1:] == [0.25, 0.25]
    assert len([r for r in server.requests if "RESPONSE A" in r.prompt]) == 6


async def test_judge_without_verdict_drops_the_group(tok_dir):
    env, server = await make_env("judge", tok_dir, lambda r: "I refuse to judge", group_size=2,
                                 judge_retries=1)
    with pytest.raises(RolloutError, match="no parseable verdict in 2 attempts"):
        await env.collect_trajectories(await env.get_next_item())
    retries = [r for r in server.requests if "strict judge" in r.prompt]
    assert sorted(r.kwargs["temperature"] for r in retries) == [0.0, 0.0, 0.7, 0.7]
    # evaluate reports judge failures as a rate instead of crashing or scoring them 0
    metrics = await env.evaluate()
    assert metrics == {"eval/judge_failure_rate": 1.0}


def test_judge_parsers():
    from atroposlib.environments.judge_env import parse_preference, parse_rating

    assert parse_rating("Score: 7") == 7.0
    assert parse_rating("I'd say \\boxed{9}") == 9.0
    assert parse_rating("8/10") == 8.0
    assert parse_rating("Score: 42") is None
    assert parse_preference("\\boxed{B}") == "B"
    assert parse_preference("Response A is better than response B") is None


# ------------------------------------------------------------------ code execution
HOSTILE = {
    "fake verdict then exit": "```python\nimport sys\nprint('{\"passed\": 2, \"total\": 2}')\nsys.exit(0)\n```",
    "os._exit": "```python\nimport os\nos._exit(0)\n```",
    "fork bomb": "```python\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n```",
    "infinite loop": "```python\nwhile True:\n    pass\n```",
    "huge allocation": "```python\nx = bytearray(50 * 1024**3)\ndef add(a, b):\n    return a + b\n```",
    "network": "```python\nimport urllib.request\nurllib.request.urlopen('http://127.0.0.1:9100/v1/models')\ndef add(a, b):\n    return a + b\n```",
}


async def test_code_env_rewards_passing_code_only(tok_dir, data_files):  # noqa: F811
    replies = itertools.cycle(["```python\ndef add(a, b):\n    return a + b\n```",
                               "```python\ndef add(a, b):\n    return a * b\n```",
                               *HOSTILE.values()])
    n = 2 + len(HOSTILE)
    env, _ = await make_env("code_execution", tok_dir, lambda r: next(replies),
                            dataset_name=data_files["code"], group_size=n, cpu_seconds=1,
                            wall_seconds=3, max_processes=8, memory_mb=256)
    group, _ = await env.collect_trajectories(await env.get_next_item())
    assert group["scores"] == [1.0] + [-1.0] * (n - 1)
    partial, _ = await make_env("code_execution", tok_dir,
                                lambda r: "```python\ndef add(a, b):\n    return a * b\n```",
                                dataset_name=data_files["code"], group_size=1, partial_credit=True)
    score, verdict = await partial.score_code(await partial.get_next_item(), "def add(a, b):\n    return a * b")
    assert verdict["passed"] == 1 and score == 0.0  # 1 of 2 tests (0*0 == 0) -> 2*0.5-1


def test_code_problem_schemas():
    from atroposlib.environments.code_execution_env import extract_code, normalise_problem

    he = normalise_problem({"prompt": "def f(x):\n    '''double'''\n", "test": "def check(c):\n    assert c(2) == 4\n",
                            "entry_point": "f"})
    assert he["tests"] == ["def check(c):\n    assert c(2) == 4\n\ncheck(f)"]
    with pytest.raises(KeyError, match="neither MBPP"):
        normalise_problem({"foo": 1})
    assert extract_code("text\n```python\na = 1\n```\nmore\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("```python\nunterminated = 1") == "unterminated = 1"
    assert extract_code("plain = 1") == "plain = 1"


async def test_code_env_humaneval_row(tok_dir, tmp_path):
    rows = tmp_path / "he.jsonl"
    rows.write_text(json.dumps({"prompt": "def double(x):\n", "test": "def check(c):\n    assert c(3) == 6\n",
                                "entry_point": "double"}) + "\n")
    replies = itertools.cycle(["```python\ndef double(x):\n    return 2 * x\n```", "```python\ndef double(x):\n    return x\n```"])
    groups = await check_env(env_class("code_execution"), FakeServer(lambda r: next(replies)),
                             {"tokenizer_name": tok_dir, "group_size": 2, "dataset_name": str(rows)})
    assert groups[0]["scores"] == [1.0, -1.0]


# ------------------------------------------------------------------ multimodal
async def test_multimodal_sends_the_image_and_counts_match_it(tok_dir):
    from PIL import Image

    from atroposlib.environments.multimodal_counting_env import COLORS, SHAPES

    env, server = await make_env("multimodal_counting", tok_dir, lambda r: "<answer>1</answer>",
                                 group_size=2, image_size=200, grid=4)
    for _ in range(5):
        item = await env.get_next_item()
        group, _ = await env.collect_trajectories(item)
        parts = server.requests[-1].messages[0]["content"]
        url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
        assert url.startswith("data:image/png;base64,") and group["images"] == [url, url]
        image = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
        cell = 200 // 4
        # count cells whose centre has the asked colour; the shape is confirmed via fill ratio
        color, shape = item["color"], item["shape"]
        count = 0
        for r in range(4):
            for c in range(4):
                box = image.crop((c * cell, r * cell, (c + 1) * cell, (r + 1) * cell))
                pixels = list(box.getdata())
                fill = sum(p == COLORS[color] for p in pixels) / len(pixels)
                kind = "square" if fill > 0.4 else "circle" if fill > 0.3 else "triangle" if fill > 0.1 else None
                count += kind == shape
        assert shape in SHAPES and count == item["answer"]
        assert group["scores"] == [float(item["answer"] == 1)] * 2
        assert "<image>" in env.tokenizer.decode(group["tokens"][0])
