"""Every environment of the collection passes check_env (FakeServer) and runs from its CLI."""

from __future__ import annotations

import importlib
import itertools
import json
import re

import pytest

from atroposlib.env_runtime.checks import check_env
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


def _mcqa_reply(req):
    return ["<answer>B</answer>", "The answer is C", "<answer>A</answer>"][req.index % 3]


def _tool_reply(req):
    m = re.search(r"Set a timer for (\d+) minutes", req.prompt)
    good = f'<tool_call>{{"name": "set_timer", "arguments": {{"minutes": {m.group(1)}}}}}</tool_call>'
    return [good, '<tool_call>{"name": "set_timer", "arguments": {"minutes": 0}}</tool_call>',
            "<tool_call>not json</tool_call>"][req.index % 3]


def _calculator_reply(req):
    if "<|im_start|>tool" in req.prompt:
        result = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", req.prompt)[-1]
        return f"<answer>{result}</answer>"
    expr = re.search(r"(\d+) boxes of (\d+) pens and has (\d+)", req.prompt)
    if expr:
        a, b, c = expr.groups()
        return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{a}*{b}+{c}"}}}}</tool_call>'
    return "<answer>0</answer>"


def _judge_reply(req):
    if "You are a strict judge" in req.prompt:
        return "Score: 9" if "RESPONSE:\nGood answer" in req.prompt else "Score: 2"
    return ["Good answer", "bad answer"][req.index % 2]


def _code_reply(req):
    return ["```python\ndef add(a, b):\n    return a + b\n```",
            "```python\ndef add(a, b):\n    return a - b\n```",
            "```python\nwhile True:\n    pass\n```"][req.index % 3]


def _mm_reply(req):
    return ["<answer>1</answer>", "<answer>0</answer>", "I don't know"][req.index % 3]


@pytest.fixture
def data_files(tmp_path):
    """Small local datasets the dataset-backed envs read (no hub access in tests)."""
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": f"{i} plus {i}\n#### {2 * i}"}) + "\n" for i in range(1, 6)))
    mc = tmp_path / "mc.jsonl"
    mc.write_text("".join(json.dumps({"question": f"Q{i}: pick B", "choices": ["no", "yes", "maybe"], "answer": 1}) + "\n" for i in range(5)))
    tools = tmp_path / "tools.jsonl"
    spec = [{"name": "set_timer", "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}}}}]
    tools.write_text("".join(json.dumps({"query": f"Set a timer for {m} minutes, please.", "tools": json.dumps(spec), "answers": json.dumps([{"name": "set_timer", "arguments": {"minutes": m}}])}) + "\n" for m in (3, 5, 7, 9, 11)))
    code = tmp_path / "mbpp.jsonl"
    code.write_text(json.dumps({"text": "Write add(a, b).", "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]}) + "\n")
    return {"qa": str(qa), "mc": str(mc), "tools": str(tools), "code": str(code)}


#: name -> (module, class, fake reply, config overrides; "{qa}" etc. name a data file)
CASES = {
    "letter_counting": ("letter_counting_env", "LetterCountingEnv", _letter_reply, {}),
    "text_reversal": ("text_reversal_env", "TextReversalEnv", _reversal_reply, {}),
    "blackjack": ("blackjack_env", "BlackjackEnv", _cycle("hit", "stick", "I stick", "?", "stand"), {}),
    "taxi": ("taxi_env", "TaxiEnv", _cycle("north", "pickup", "west", "dance"), {"max_turns": 4}),
    "dataset": ("dataset_env", "DatasetEnv", _cycle("\\boxed{2}", "\\boxed{4}", "no"), {"dataset_name": "{qa}", "shuffle": False}),
    "mcqa": ("mcqa_env", "MCQAEnv", _mcqa_reply, {"dataset_name": "{mc}", "eval_split": "train"}),
    "tool_calling": ("tool_calling_env", "ToolCallingEnv", _tool_reply, {"dataset_name": "{tools}"}),
    "calculator": ("calculator_env", "CalculatorEnv", _calculator_reply, {"max_turns": 3}),
    "judge": ("judge_env", "JudgeEnv", _judge_reply, {}),
    "code_execution": ("code_execution_env", "CodeExecutionEnv", _code_reply, {"dataset_name": "{code}", "cpu_seconds": 1, "wall_seconds": 3}),
    "multimodal_counting": ("multimodal_counting_env", "MultimodalCountingEnv", _mm_reply, {}),
}


def env_class(name: str):
    module, cls, _, _ = CASES[name]
    return getattr(importlib.import_module(f"atroposlib.environments.{module}"), cls)


def overrides_for(name: str, data_files: dict[str, str]) -> dict:
    return {k: (v.format(**data_files) if isinstance(v, str) else v) for k, v in CASES[name][3].items()}


@pytest.mark.parametrize("name", sorted(CASES))
async def test_check_env(name, tok_dir, data_files):
    groups = await check_env(
        env_class(name), FakeServer(CASES[name][2]),
        {"tokenizer_name": tok_dir, "group_size": 3, **overrides_for(name, data_files)},
        num_groups=2,
    )
    assert len(groups) == 2
    for group in groups:
        assert len(group["messages"]) == 3
        if name == "multimodal_counting":
            assert group["images"] and group.get("inference_logprobs") is None
        else:
            assert len(group["inference_logprobs"]) == 3


@pytest.mark.parametrize("name", ["letter_counting", "blackjack", "code_execution"])
def test_process_cli_writes_groups(name, tok_dir, data_files, tmp_path):
    from atroposlib.env_runtime.command_line import run_cli

    out = tmp_path / f"{name}.jsonl"
    flags = [f"--env.{k}={v}" for k, v in overrides_for(name, data_files).items()]
    run_cli(env_class(name), ["process", "--testing", f"--env.tokenizer_name={tok_dir}",
                              "--env.group_size=2", "--env.total_steps=2",
                              f"--env.data_path_to_save_groups={out}", *flags])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 2 and all(len(g["tokens"]) == 2 for g in lines)
    assert out.with_suffix(".html").exists()


def test_evaluate_cli_writes_metrics(tok_dir, tmp_path):
    from atroposlib.env_runtime.command_line import run_cli

    run_cli(env_class("letter_counting"), ["evaluate", "--testing", f"--env.tokenizer_name={tok_dir}",
                                          "--env.eval_size=3", f"--env.data_dir_to_save_evals={tmp_path}"])
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["results"]["all"]["eval/num_items"] == 3.0
    assert (tmp_path / "samples.jsonl").read_text().count("\n") == 3


@pytest.mark.parametrize("name", sorted(CASES))
def test_cli_help_lists_env_options(name, capsys):
    from atroposlib.env_runtime.command_line import run_cli

    with pytest.raises(SystemExit) as exc:
        run_cli(env_class(name), ["serve", "--help"])
    assert exc.value.code == 0
    assert "--env.group_size" in capsys.readouterr().out
