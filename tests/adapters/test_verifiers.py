"""The verifiers adapter against the in-process fake inference server (fast, no vLLM).

Real verifiers 0.4 machinery runs every rollout (harness program in a subprocess, interception
server, stop conditions, scripted user turns, rubric); only the model is scripted.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

from atroposlib.adapters import adapter_env_class  # noqa: E402
from atroposlib.adapters.verifiers import verifiers_env_class  # noqa: E402
from atroposlib.api.models import IGNORE_INDEX, MASKED_LOGPROB  # noqa: E402
from atroposlib.errors import ConfigError  # noqa: E402
from atroposlib.testing.fake_server import FakeOpenAIServer, FakeServer, fake_logprob  # noqa: E402
from tests.adapters.vf_echo_chat.taskset import WORDS  # noqa: E402
from tests.adapters.vf_reverse.taskset import extract  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def make_env(spec, tok_dir, tok, replies, **config):
    cls = verifiers_env_class(spec)
    cfg = cls.env_config_cls(**{"tokenizer_name": tok_dir, "use_wandb": False, "max_tokens": 48,
                                **config})
    server = FakeServer(replies, tokenizer=tok)
    return cls(cfg, [server]), server


def generated_spans(masks):
    """Runs of trained positions: [(start, end), ...]."""
    spans, start = [], None
    for i, m in enumerate([*masks, IGNORE_INDEX]):
        if m != IGNORE_INDEX and start is None:
            start = i
        elif m == IGNORE_INDEX and start is not None:
            spans.append((start, i))
            start = None
    return spans


async def one_group(env):
    await env.setup()
    item = await env.get_next_item()
    group, backlog = await env.collect_trajectories(item)
    return item, group, backlog


def test_single_turn_group_is_scored_by_the_taskset_rubric(tiny_tok_dir, tiny_tok):
    replies = ["<answer>tac</answer>", "<answer>cat</answer>", "tca", "<answer>ta</answer>"]
    env, server = make_env("tests.adapters.vf_reverse", tiny_tok_dir, tiny_tok, replies, group_size=4)
    item, group, backlog = asyncio.run(one_group(env))
    assert backlog == [] and len(group["tokens"]) == 4 and "group_overrides" not in group
    assert item.data.answer == "tac"
    seen = []
    for tokens, masks, logprobs, score, messages in zip(
        group["tokens"], group["masks"], group["scores"] and group["inference_logprobs"],
        group["scores"], group["messages"], strict=True,
    ):
        assert len(tokens) == len(masks) == len(logprobs)
        (start, end), = generated_spans(masks)  # one model turn, at the end
        assert end == len(tokens)
        completion = tokens[start:]
        assert completion[-1] == tiny_tok.eos_token_id
        assert logprobs[start:] == [fake_logprob(t) for t in completion]
        assert all(lp == MASKED_LOGPROB for lp in logprobs[:start])
        prompt = tiny_tok.decode(tokens[:start])
        assert "Reverse: cat" in prompt and "Answer inside <answer></answer>" in prompt
        reply = tiny_tok.decode(completion, skip_special_tokens=True)
        seen.append(reply)
        # The rubric of the task itself, applied to the decoded completion.
        from difflib import SequenceMatcher

        assert score == pytest.approx(SequenceMatcher(None, extract(reply), "tac").ratio())
        assert messages[-1] == {"role": "assistant", "content": reply}
    assert sorted(seen) == sorted(replies)
    assert sorted(group["scores"])[-1] == 1.0 and min(group["scores"]) < 1.0
    assert len(server.requests) == 4 and all(r.kind == "tokens" for r in server.requests)


def test_multi_turn_trains_every_assistant_turn_and_masks_the_user(tiny_tok_dir, tiny_tok):
    def reply(request):
        last = request.prompt.rsplit("single word: ", 1)[-1].split("<", 1)[0].strip()
        return f"{last}!" if request.prompt.count("<|im_start|>user") != 2 else "no"

    env, _ = make_env("tests.adapters.vf_echo_chat", tiny_tok_dir, tiny_tok, reply, group_size=2)
    _, group, _ = asyncio.run(one_group(env))
    words = WORDS[0]
    for tokens, masks, score in zip(group["tokens"], group["masks"], group["scores"], strict=True):
        spans = generated_spans(masks)
        assert len(spans) == len(words)
        replies = [tiny_tok.decode(tokens[a:b], skip_special_tokens=True) for a, b in spans]
        assert replies == ["red!", "no", "green!"]
        for (a, _), word in zip(spans, words, strict=True):  # each user turn is in the prompt
            assert f"single word: {word}" in tiny_tok.decode(tokens[:a])
        assert score == pytest.approx(2 / 3)


def test_knobs_are_flags_and_reach_verifiers(tiny_tok_dir, tmp_path):
    from atroposlib.env_runtime.command_line import build_env

    data = tmp_path / "other.jsonl"
    data.write_text(json.dumps({"word": "pond"}) + "\n")
    cls = adapter_env_class("verifiers:tests.adapters.vf_reverse")
    assert "taskset.data_file" in cls.knob_names and "agent.harness.id" in cls.knob_names
    assert not any(k.startswith(("agent.client", "agent.model", "agent.sampling"))
                   for k in cls.knob_names)
    mode, env = build_env(cls, ["process", "--env.tokenizer_name", tiny_tok_dir,
                                "--env.taskset.data_file", str(data), "--env.timeout.episode", "30",
                                "--env.vf_config", '{"agent": {"max_turns": 3}}'])
    vf_config = env.vf_env_config()
    assert mode == "process"
    assert vf_config.taskset.data_file == str(data)
    assert vf_config.timeout.episode == 30.0 and vf_config.agent.max_turns == 3
    assert vf_config.agent.runtime.type == "subprocess" and vf_config.agent.harness.id == "null"


async def broken_reward(trace) -> float:
    raise RuntimeError("the rubric broke")


def test_failed_episodes_drop_the_group_and_are_counted(tiny_tok_dir, tiny_tok, caplog):
    """A rollout whose rubric raises is dropped with its group (never scored 0)."""
    plugged = {"similarity": {"fn": f"{__name__}:broken_reward"}}
    env, _ = make_env("tests.adapters.vf_reverse", tiny_tok_dir, tiny_tok, ["x"], group_size=2,
                      **{"taskset.task.rewards": plugged})
    _, group, _ = asyncio.run(one_group(env))
    assert group is None and env.stats["verifiers_failed_episodes"] == 1
    assert "the rubric broke" in caplog.text


def test_bad_specs_are_clear_config_errors():
    with pytest.raises(ConfigError, match="cannot import"):
        adapter_env_class("verifiers:no_such_module.tasks")
    with pytest.raises(ConfigError, match="not a verifiers Taskset"):
        adapter_env_class("verifiers:tests.adapters.vf_reverse.taskset:extract")
    with pytest.raises(ConfigError, match="unknown adapter"):
        adapter_env_class("nope:x")


def test_module_object_spec_names_the_class(tiny_tok_dir, tiny_tok):
    env, _ = make_env("tests.adapters.vf_reverse.taskset:ReverseTaskset", tiny_tok_dir, tiny_tok,
                      ["<answer>tac</answer>"], group_size=2)
    _, group, _ = asyncio.run(one_group(env))
    assert group["scores"] == [1.0, 1.0]


def test_atropos_env_process_runs_a_verifiers_env(tiny_tok_dir, tiny_tok, tmp_path):
    """The whole command line, against a real HTTP fake vLLM."""
    out = tmp_path / "groups.jsonl"
    with FakeOpenAIServer(FakeServer(["<answer>tac</answer>", "no"], tokenizer=tiny_tok)) as fake:
        result = subprocess.run(
            [sys.executable, "-m", "atroposlib.cli.env", "verifiers:tests.adapters.vf_reverse",
             "process", "--env.tokenizer_name", tiny_tok_dir, "--env.group_size", "2",
             "--env.total_steps", "2", "--env.data_path_to_save_groups", str(out),
             "--openai.base_url", fake.base_url, "--openai.model_name", "fake",
             "--openai.server_type", "vllm", "--openai.api_key", "x"],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2
    for group in groups:
        assert sorted(group["scores"])[-1] == 1.0 or max(group["scores"]) < 1.0
        assert len(group["tokens"]) == 2 and group["inference_logprobs"]


def test_tool_environment_calls_its_mcp_tool(tiny_tok_dir, tiny_tok, monkeypatch):
    """The model's <tool_call> becomes an OpenAI tool call, verifiers runs the MCP tool, the
    result comes back as a (masked) tool turn and the model's second turn is trained too."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the tool server is `python -m tests.adapters...`

    def reply(request):
        if "7431" in request.prompt:
            return "The code is 7431."
        return '<tool_call>\n{"name": "codes_lookup", "arguments": {"color": "red"}}\n</tool_call>'

    env, _ = make_env("tests.adapters.vf_lookup", tiny_tok_dir, tiny_tok, reply, group_size=2,
                      max_tokens=128)  # one token per byte
    _, group, _ = asyncio.run(one_group(env))
    assert group["scores"] == [1.0, 1.0]
    for tokens, masks, messages in zip(group["tokens"], group["masks"], group["messages"],
                                       strict=True):
        turns = [tiny_tok.decode(tokens[a:b], skip_special_tokens=True)
                 for a, b in generated_spans(masks)]
        assert turns[0].startswith("<tool_call>") and turns[-1] == "The code is 7431."
        assert [m["role"] for m in messages][-3:] == ["assistant", "tool", "assistant"]
        assert messages[-2]["content"] == "7431"


def test_evaluate_runs_one_greedy_episode_per_task(tiny_tok_dir, tiny_tok, tmp_path):
    env, server = make_env("tests.adapters.vf_reverse", tiny_tok_dir, tiny_tok,
                           ["<answer>tac</answer>"], eval_limit=3,
                           data_dir_to_save_evals=str(tmp_path / "evals"))

    async def run():
        await env.setup()
        return await env.evaluate()

    metrics = asyncio.run(run())
    assert metrics["eval/num_tasks"] == 3 and metrics["eval/failed_fraction"] == 0.0
    assert metrics["eval/metric/tagged"] == 1.0  # the task's own @vf.metric
    assert 0.0 < metrics["eval/mean_reward"] < 1.0  # right for "cat" only
    assert {r.kwargs.get("temperature") for r in server.requests} == {0.0}
    assert (tmp_path / "evals" / "metrics.json").exists()


def test_defaults_to_the_projects_vllm_and_refuses_a_backend_without_token_logprobs(tiny_tok_dir):
    from atroposlib.defaults import DEFAULT_INFERENCE_URL
    from atroposlib.inference.clients.config import APIServerConfig

    cls = verifiers_env_class("tests.adapters.vf_reverse")
    _, servers = cls.config_init()
    assert [(s.base_url, s.server_type) for s in servers] == [(DEFAULT_INFERENCE_URL, "vllm")]
    cfg = cls.env_config_cls(tokenizer_name=tiny_tok_dir, use_wandb=False)
    env = cls(cfg, [APIServerConfig(base_url="http://127.0.0.1:9/v1", model_name="m", api_key="x",
                                    server_type="openai")])
    with pytest.raises(ConfigError, match=r"127\.0\.0\.1:9/v1.*--openai\.server_type vllm"):
        asyncio.run(env.setup())  # before any rollout, not after hundreds of failed ones


def test_self_play_gives_each_trainable_agent_its_own_group(tiny_tok_dir, tiny_tok):
    # Both seats are the run's model: each seat's rollouts of the hand form one group,
    # holding only that seat's conversation and scored with that seat's reward.
    def reply(request):
        return "7" if "You sit north" in request.prompt else "3"

    env, server = make_env("tests.adapters.vf_duel", tiny_tok_dir, tiny_tok, reply, group_size=3)
    _, groups, _ = asyncio.run(one_group(env))
    assert isinstance(groups, list) and len(groups) == 2
    seats = []
    for group in groups:
        assert len(group["tokens"]) == 3 and "group_overrides" not in group
        prompts = {tiny_tok.decode(t[:generated_spans(m)[0][0]])
                   for t, m in zip(group["tokens"], group["masks"], strict=True)}
        (prompt,) = prompts  # one seat's conversation per group, the same hand
        seat = "north" if "You sit north" in prompt else "south"
        assert f"You sit {'south' if seat == 'north' else 'north'}" not in prompt
        seats.append(seat)
        for tokens, masks, messages in zip(group["tokens"], group["masks"], group["messages"],
                                           strict=True):
            (start, end), = generated_spans(masks)
            assert tiny_tok.decode(tokens[start:end], skip_special_tokens=True) == (
                "7" if seat == "north" else "3")
            assert messages[0]["content"] == f"You sit {seat}. Name a number."
        assert group["scores"] == [1.0 if seat == "north" else -1.0] * 3
    assert sorted(seats) == ["north", "south"]
    assert len(server.requests) == 6


def test_a_seat_that_never_played_has_no_rollout(tiny_tok_dir, tiny_tok):
    # north forfeits before south's turn: south's trace has no model call, nothing to train.
    env, server = make_env("tests.adapters.vf_duel", tiny_tok_dir, tiny_tok,
                           lambda request: "I pass", group_size=2)
    _, group, _ = asyncio.run(one_group(env))
    assert isinstance(group, dict) and group["scores"] == [-1.0, -1.0]
    assert all("You sit north" in tiny_tok.decode(t) for t in group["tokens"])
    assert len(server.requests) == 2
