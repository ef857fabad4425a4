"""benchmarks/compat_verifiers.py: arguments, the re-scoring by verifiers, the comparison."""

from __future__ import annotations

from difflib import SequenceMatcher

import pytest

from benchmarks import compat_verifiers as cv


def checkout(tmp_path, *envs):
    for name in envs:
        (tmp_path / "environments" / name).mkdir(parents=True)
        (tmp_path / "environments" / name / "pyproject.toml").write_text("[project]\n")
    return tmp_path


def test_arguments_default_to_the_published_envs_and_reject_what_is_not_there(tmp_path, capsys):
    root = checkout(tmp_path, *cv.DEFAULT_ENVS)
    args = cv.parse_args([str(root)])
    assert args.envs == list(cv.DEFAULT_ENVS) and (args.groups, args.group_size) == (2, 4)
    args = cv.parse_args([str(root), "--envs", "glossary", "--groups", "1", "--group-size", "2"])
    assert args.envs == ["glossary"] and (args.groups, args.group_size) == (1, 2)
    for argv, said in (([str(tmp_path / "nowhere")], "has no environments/ folder"),
                       ([str(root), "--envs", "wordle"], "not an env package"),
                       ([str(root), "--groups", "0"], "at least 1")):
        with pytest.raises(SystemExit):
            cv.parse_args(argv)
        assert said in capsys.readouterr().err
    assert cv.env_id("kuhn_poker") == "kuhn-poker" and cv.env_id("glossary") == "glossary"


def test_compare_counts_matches_mismatches_and_what_cannot_be_rescored():
    got = cv.compare([1.0, 0.5, 0.0, 2.0], [1.0, 0.25, None, 2.0 + 1e-9])
    assert got == {"rollouts": 4, "matched": 2, "mismatched": 1, "not_rescorable": 1,
                   "mismatches": [{"index": 1, "score": 0.5, "expected": 0.25}]}
    with pytest.raises(ValueError, match="2 scores but 1"):
        cv.compare([1.0, 0.0], [1.0])


def test_verdict_needs_every_group_and_no_mismatch():
    assert cv.verdict({"groups": 2, "matched": 8, "mismatched": 0}, 2) == "pass"
    assert cv.verdict({"groups": 1, "matched": 4, "mismatched": 0}, 2) == "fail"
    assert cv.verdict({"groups": 2, "matched": 7, "mismatched": 1}, 2) == "fail"
    assert cv.verdict({"groups": 4, "matched": 0, "not_rescorable": 8}, 2) == "pass (not re-scored)"


def test_rescore_runs_the_tasks_own_rubric_on_the_recorded_conversation():
    pytest.importorskip("verifiers.v1")
    from atroposlib.adapters.verifiers import resolve_spec
    from tests.adapters.vf_reverse.taskset import SYSTEM

    tasks = cv._tasks(resolve_spec("tests.adapters.vf_reverse"))

    def convo(word, reply):
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Reverse: {word}"},
                {"role": "assistant", "content": reply}]

    assert cv.rescore(tasks, convo("cat", "<answer>tac</answer>")) == 1.0
    assert cv.rescore(tasks, convo("cat", "<answer>tca</answer>")) == pytest.approx(
        SequenceMatcher(None, "tca", "tac").ratio())
    assert cv.rescore(tasks, convo("zebra-not-a-task", "x")) is None  # no task has this prompt
    duel = cv._tasks(resolve_spec("tests.adapters.vf_duel"))
    assert cv.rescore(duel, [{"role": "user", "content": "Your number?"}]) is None  # a prompt-less seat


def test_conversation_counts_say_what_the_rollouts_did(tmp_path):
    from transformers import AutoTokenizer

    from atroposlib.testing.tiny_tokenizer import make_tiny_tokenizer

    make_tiny_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    groups = [{"tokens": [tok.encode("sys <tools>[]</tools> hi"), tok.encode("hi")],
               "messages": [[{"role": "user", "content": "hi"},
                             {"role": "assistant", "content": "", "tool_calls": [call]},
                             {"role": "tool", "content": "42"},
                             {"role": "assistant", "content": "42"}],
                            [{"role": "user", "content": "hi"},
                             {"role": "assistant", "content": "no"}]]}]
    assert cv.conversation_counts(groups, tmp_path) == {
        "assistant_turns": 3, "tool_calls": 1, "tool_results": 1,
        "rollouts_with_tools_in_prompt": 1}
    assert cv.conversation_counts([], tmp_path)["assistant_turns"] == 0
