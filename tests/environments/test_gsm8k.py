"""GSM8K env: answer parsing, math-verify scoring, length penalty, data loading, check_env, eval."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from atroposlib.env_runtime.checks import check_env
from atroposlib.environments.gsm8k_server import (
    GSM8kEnv,
    gold_answer,
    length_penalised,
    parse_gold,
    score_answer,
)
from atroposlib.envs.run_state import RunState
from atroposlib.errors import ConfigError, RolloutError
from atroposlib.inference.bundled import bundled_model_dir
from atroposlib.testing.fake_server import FakeServer

REPO = Path(__file__).resolve().parents[2]
SHARED_GSM8K = (REPO / "../shared/data/gsm8k").resolve()
BUNDLED = bundled_model_dir()
# The session fixture builds the bundled model when missing (a fresh machine), so these
# tests run rather than skip there.
needs_tokenizer = pytest.mark.usefixtures("bundled_model_dir")
needs_shared_data = pytest.mark.skipif(
    not (SHARED_GSM8K / "train.jsonl").exists(), reason=f"GSM8K not found at {SHARED_GSM8K}"
)


@pytest.fixture
def tiny_gsm8k(tmp_path):
    """A small GSM8K-format directory: 'What is a + b?' with answers after '####'."""
    for split, count in (("train", 6), ("test", 5)):
        with open(tmp_path / f"{split}.jsonl", "w") as fh:
            for i in range(count):
                a, b = 1000 * (i + 1), i + 2
                fh.write(
                    json.dumps(
                        {"question": f"What is {a} + {b}?", "answer": f"{a}+{b}\n#### {a + b:,}"}
                    )
                    + "\n"
                )
    return tmp_path


def test_gold_answer_takes_the_text_after_the_last_hash_without_commas():
    assert gold_answer("She pays 3 * 400 = <<3*400=1200>>1,200.\n#### 1,200") == "1200"
    assert gold_answer("#### -5") == "-5"


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("So the total is \\boxed{1200}.", True),
        ("\\boxed{1,200}", True),
        ("\\boxed{1200.0}", True),
        ("\\boxed{1201}", False),
        ("The total is 1200.", False),  # no \boxed{} and no LaTeX anchor: no credit
        ("<think>maybe \\boxed{1200}</think> final: \\boxed{7}", False),  # after </think> only
        ("<think>hmm \\boxed{7}</think> so \\boxed{1200}", True),
        ("", False),
    ],
)
def test_score_answer_uses_math_verify_on_the_final_answer(reply, expected):
    assert score_answer(reply, parse_gold("1200")) is expected


def test_score_answer_works_from_a_worker_thread():
    # math-verify's signal-based timeouts only work in the main thread; the env disables them.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(score_answer, "\\boxed{42}", parse_gold("42")).result() is True


def test_length_penalty_only_when_all_correct():
    assert length_penalised([1.0, 1.0, 1.0], [100, 1536, 2048], 2048) == [1.0, 0.5, 0.0]
    assert length_penalised([1.0, 1.0], [1024, 4000], 2048) == [1.0, 0.0]
    assert length_penalised([1.0, -1.0], [2000, 2000], 2048) == [1.0, -1.0]
    with pytest.raises(ValueError, match="max_token_length"):
        length_penalised([1.0], [5], 0)


@needs_tokenizer
@needs_shared_data
async def test_loads_the_shared_gsm8k_directory():
    config, servers = GSM8kEnv.config_init()
    config = config.model_copy(update={"dataset_name": str(SHARED_GSM8K), "eval_limit": 100})
    env = GSM8kEnv(config, [FakeServer()])
    await env.setup()
    assert len(env.train_items) == 7473 and len(env.eval_items) == 100
    item = await env.get_next_item()
    assert item["question"] and re.fullmatch(r"-?[\d.]+", item["answer"])
    # seeded shuffle: the same order every time
    env2 = GSM8kEnv(config, [FakeServer()])
    await env2.setup()
    assert env2.train_items[:3] == env.train_items[:3]
    assert env2.eval_items[:3] == env.eval_items[:3]


async def test_bad_dataset_path_is_a_clear_config_error(tmp_path):
    (tmp_path / "train.jsonl").write_text("")
    config, _ = GSM8kEnv.config_init()
    env = GSM8kEnv(config.model_copy(update={"dataset_name": str(tmp_path)}), [FakeServer()])
    with pytest.raises(ConfigError, match="test.jsonl"):
        await env.setup()


def _reply_right_for_first(request):
    a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", request.prompt)[-1])
    answer = a + b if request.index == 0 else a + b + 1
    return f"First add the numbers carefully, step by step. The answer is \\boxed{{{answer}}}"


@needs_tokenizer
async def test_check_env_groups_have_exact_tokens_masks_logprobs_and_scores(tiny_gsm8k):
    groups = await check_env(
        GSM8kEnv,
        server=FakeServer(_reply_right_for_first),
        config_overrides={
            "tokenizer_name": str(BUNDLED),
            "group_size": 4,
            "dataset_name": str(tiny_gsm8k),
            "max_token_length": 1024,
            "include_messages": True,
        },
        num_groups=2,
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(BUNDLED)
    for group in groups:
        assert sorted(group["scores"]) == [-1.0, -1.0, -1.0, 1.0]
        assert group["generation_params"] == {"temperature": 1.0}
        for tokens, masks, logprobs, messages in zip(
            group["tokens"],
            group["masks"],
            group["inference_logprobs"],
            group["messages"],
            strict=True,
        ):
            prompt = tok.apply_chat_template(
                messages[:-1], tokenize=False, add_generation_prompt=True
            )
            prompt_ids = tok.encode(prompt, add_special_tokens=False)
            assert tokens[: len(prompt_ids)] == prompt_ids
            assert masks[: len(prompt_ids)] == [-100] * len(prompt_ids)
            assert masks[len(prompt_ids) :] == tokens[len(prompt_ids) :]
            assert len(logprobs) == len(tokens)
            assert messages[0]["role"] == "system" and "\\boxed{" in messages[0]["content"]
            assert messages[-1]["content"].startswith("First add")


def _node(n_prompt: int, n_generated: int):
    return SimpleNamespace(
        tokens=list(range(n_prompt + n_generated)),
        masked_tokens=[-100] * n_prompt + list(range(n_prompt, n_prompt + n_generated)),
        logprobs=[1.0] * n_prompt + [-0.5] * n_generated,
    )


class _ScriptedManaged:
    """A managed_server stand-in returning fixed (reply, node) pairs."""

    def __init__(self, rollouts):
        self.rollouts = rollouts

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def chat_completion(self, **kwargs):
        choices = [
            SimpleNamespace(message=SimpleNamespace(content=text), finish_reason="stop")
            for text, _ in self.rollouts
        ]
        return SimpleNamespace(choices=choices)

    def get_state(self):
        return {"nodes": [node for _, node in self.rollouts]}


async def _group(env, rollouts, gold="5"):
    env.server.managed_server = lambda **_kw: _ScriptedManaged(rollouts)
    group, backlog = await env.collect_trajectories({"question": "What is 2 + 3?", "answer": gold})
    assert backlog == []
    return group


@needs_tokenizer
async def test_groups_penalise_long_all_correct_answers_and_drop_short_replies():
    config, _ = GSM8kEnv.config_init()
    env = GSM8kEnv(
        config.model_copy(update={"group_size": 2, "max_token_length": 100, "system_prompt": ""}),
        [FakeServer()],
    )
    right = "\\boxed{5}"
    short, long = _node(20, 20), _node(20, 55)
    group = await _group(env, [(right, short), (right, long)])
    assert group["scores"] == [1.0, 1.0 - (75 - 50) / 50]  # both right: the longer one pays
    assert group["messages"] is None  # token-only unless --env.include_messages
    # identical scores carry no signal: BaseEnv drops such groups (ensure_scores_are_not_same)
    assert (await _group(env, [(right, short)] * 2))["scores"] == [1.0, 1.0]
    assert (await _group(env, [("\\boxed{4}", short)] * 2))["scores"] == [-1.0, -1.0]
    too_short = [(right, _node(20, 3)), (right, long)]
    assert await _group(env, too_short) is None  # < 10 generated tokens: skipped, group too small
    assert env.train_correct.count(1.0) == 5  # every scored right answer counts
    with pytest.raises(RolloutError, match="gold answer"):
        await _group(env, [(right, short)] * 2, gold="")


@needs_tokenizer
async def test_evaluate_reports_accuracy_and_writes_samples(tiny_gsm8k, tmp_path):
    config, _ = GSM8kEnv.config_init()
    config = config.model_copy(
        update={
            "tokenizer_name": str(BUNDLED),
            "dataset_name": str(tiny_gsm8k),
            "eval_limit": 4,
            "data_dir_to_save_evals": str(tmp_path / "evals"),
        }
    )

    def reply(request):
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", request.prompt)[-1])
        return f"\\boxed{{{a + b if a <= 2000 else 0}}}"  # right for the 2 smallest questions

    server = FakeServer(reply)
    env = GSM8kEnv(config, [server])
    await env.setup()
    metrics = await env.evaluate()
    assert metrics["eval/num_questions"] == 4.0
    right = sum(
        int(re.search(r"What is (\d+)", t["question"])[1]) <= 2000 for t in env.eval_items
    )
    assert metrics["eval/percent_correct"] == right / 4
    assert all(r.kwargs.get("temperature") == 0.6 for r in server.requests)
    samples = [
        json.loads(x) for x in (tmp_path / "evals" / "samples.jsonl").read_text().splitlines()
    ]
    assert len(samples) == 4 and {s["score"] for s in samples} <= {-1.0, 1.0}
    saved = json.loads((tmp_path / "evals" / "metrics.json").read_text())
    assert saved["results"]["all"]["eval/percent_correct"] == right / 4


@needs_tokenizer
async def test_checkpoint_restores_the_position(tiny_gsm8k, tmp_path):
    config, _ = GSM8kEnv.config_init()
    config = config.model_copy(update={"dataset_name": str(tiny_gsm8k)})
    env = GSM8kEnv(config, [FakeServer()])
    env.bind_run_state(RunState(checkpoint_dir=str(tmp_path)))
    await env.setup()
    for _ in range(3):
        await env.get_next_item()
    env.save_checkpoint(7)
    fresh = GSM8kEnv(config, [FakeServer()])
    fresh.bind_run_state(RunState(checkpoint_dir=str(tmp_path), curr_step=7))
    await fresh.setup()
    fresh.load_checkpoint()
    assert fresh.iter == 3
    assert (await fresh.get_next_item()) == (await env.get_next_item())


@needs_tokenizer
async def test_completion_budget_fits_max_token_length(tiny_gsm8k):
    config, _ = GSM8kEnv.config_init()
    env = GSM8kEnv(
        config.model_copy(update={"dataset_name": str(tiny_gsm8k), "max_token_length": 300}),
        [FakeServer()],
    )
    messages = env.prompt({"question": "What is 1 + 2?"})
    budget = env.max_tokens_for(messages)
    text = env.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert budget + len(env.tokenizer.encode(text)) == 300
    env.config.max_tokens = 20
    assert env.max_tokens_for(env.prompt({"question": "What is 1 + 2?"})) == 20
    env.config.max_token_length = 10
    with pytest.raises(ValueError, match="max_token_length"):
        env.max_tokens_for(messages)


async def test_missing_local_directory_names_the_resolved_path(tmp_path):
    config, _ = GSM8kEnv.config_init()
    missing = str(tmp_path / "nope")
    env = GSM8kEnv(config.model_copy(update={"dataset_name": missing}), [FakeServer()])
    with pytest.raises(ConfigError, match="does not exist"):
        await env.setup()


def test_system_prompt_may_contain_braces_and_gets_the_budget():
    config, _ = GSM8kEnv.config_init()
    env = GSM8kEnv(config.model_copy(update={"max_tokens": 300}), [FakeServer()])
    item = {"question": "Q?"}
    assert "maximum of 300 tokens" in env.prompt(item)[0]["content"]
    assert "\\boxed{your answer here}" in env.prompt(item)[0]["content"]
    env.config.system_prompt = "Answer as \\boxed{number}; budget {max_tokens}."
    env.config.max_tokens = 50
    assert env.prompt(item) == [
        {"role": "system", "content": "Answer as \\boxed{number}; budget 50."},
        {"role": "user", "content": "Q?"},
    ]
    env.config.system_prompt = ""
    assert env.prompt(item) == [{"role": "user", "content": "Q?"}]
    env.config.max_tokens = None  # default budget: all of max_token_length
    env.config.system_prompt = "budget {max_tokens}"
    assert env.prompt(item)[0]["content"] == "budget 2048"


@pytest.mark.parametrize(
    ("reply", "boxed", "last_number"),
    [
        ("3 + 4 = 7 apples, so 1,200 in total.", False, True),
        ("It is 1200.", False, True),
        ("1200 at first, then 1199.", False, False),  # the LAST number decides
        ("\\boxed{7} although 1200 is tempting", False, False),  # a boxed answer still decides
        ("<think>1200</think> I am not sure.", False, False),
        ("No number here.", False, False),
    ],
)
def test_last_number_answer_format(reply, boxed, last_number):
    gold = parse_gold("1200")
    assert score_answer(reply, gold) is boxed
    assert score_answer(reply, gold, "last_number") is last_number
