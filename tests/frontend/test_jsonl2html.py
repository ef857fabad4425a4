"""jsonl2html: readable pages that show model-written tags literally (escaped, never stripped or run)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from atroposlib.frontend.jsonl2html import create_html_for_group, generate_html
from atroposlib.frontend.render import ScoreStats, is_correct, pooled_stats, reference_answer

TAGGED = "<think>x</think><answer>42</answer> <script>alert('pwn')</script>"
TAGGED_ESCAPED = ("&lt;think&gt;x&lt;/think&gt;&lt;answer&gt;42&lt;/answer&gt; "
                  "&lt;script&gt;alert('pwn')&lt;/script&gt;")


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "not json\n")


def _chat(question, answer):
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def test_renders_groups_scores_and_roles(tmp_path):
    src = tmp_path / "groups.jsonl"
    _write(src, [
        {"messages": [_chat("What is **2+2**?", "It is 4"), "plain string completion"],
         "scores": [1.0, -0.5]},
        {"tokens": [[1]], "scores": [0.0]},  # no messages: skipped
    ])
    out = generate_html(src)
    assert out == tmp_path / "groups.html"
    page = out.read_text()
    assert "Group 1" in page and "Group 2" not in page
    assert "<strong>2+2</strong>" in page  # markdown rendered
    assert "It is 4" in page and "plain string completion" in page
    assert "atr-score atr-pos" in page and "atr-score atr-neg" in page
    assert "2 line(s) skipped" in page


def test_think_answer_and_script_tags_are_shown_escaped(tmp_path):
    src = tmp_path / "tags.jsonl"
    _write(src, [{"messages": [_chat("Solve <b>it</b>", TAGGED)], "scores": [1.0]}])
    page = generate_html(src).read_text()
    assert TAGGED_ESCAPED in page  # every tag visible literally, nothing stripped
    assert "Solve &lt;b&gt;it&lt;/b&gt;" in page
    assert "<script" not in page and "<think>" not in page and "<answer>" not in page


def test_script_injection_is_escaped_not_run(tmp_path):
    src = tmp_path / "evil.jsonl"
    evil = '<script>alert("x")</script><img src=x onerror="alert(1)"><a href="javascript:alert(2)">l</a>'
    _write(src, [{"messages": [[{"role": "<b onmouseover=alert(3)>user</b>", "content": evil},
                                {"role": "assistant", "content": "[l](javascript:alert(5))"}]],
                  "scores": ['<script>alert(4)</script>']}])
    page = generate_html(src, tmp_path / "out" / "evil.html").read_text()
    assert "<script" not in page and "<img" not in page and "<b onmouseover" not in page
    assert "&lt;img src=x onerror=" in page  # shown as written
    assert 'href="javascript' not in page  # markdown links with unsafe schemes are refused
    assert "&lt;script&gt;alert(4)" in page  # the score is escaped, not executed


def test_prompt_appears_once_per_group_with_reference_answer():
    q = "What is 6*7? Reply as <answer>N</answer>."
    group = {"messages": [_chat(q, "<answer>42</answer>"), _chat(q, "<answer>41</answer>"),
                          _chat(q, "no idea")],
             "scores": [1.0, 0.0, -1.0], "group_overrides": {"reference_answer": "<answer>42</answer>"}}
    block = create_html_for_group(group, 1)
    escaped_q = "What is 6*7? Reply as &lt;answer&gt;N&lt;/answer&gt;."
    assert block.count(escaped_q) == 1 and "prompt shared by all 3 rollouts" in block
    assert block.count('class="atr-msg atr-user"') == 1
    assert block.count('class="atr-msg atr-assistant"') == 3
    assert "reference answer" in block and block.count("&lt;answer&gt;42&lt;/answer&gt;") == 2
    # best score first, each rollout keeps its index
    assert block.index("rollout 0") < block.index("rollout 1") < block.index("rollout 2")
    # different prompts: each rollout shows its own
    mixed = create_html_for_group({"messages": [_chat("a?", "x"), _chat("b?", "y")], "scores": [1, 0]}, 2)
    assert "prompt shared" not in mixed and mixed.count('class="atr-msg atr-user"') == 2


def test_reference_answer_is_optional_and_read_from_two_places():
    assert reference_answer({"scores": [1]}) is None
    assert reference_answer({"reference_answer": 7}) == "7"
    assert reference_answer({"group_overrides": {"reference_answer": "a"}, "reference_answer": "b"}) == "a"
    assert "reference answer" not in create_html_for_group({"messages": ["x"], "scores": [1]}, 1)


def _tokens(prompt_len, completion_len):
    return {"tokens": [7] * (prompt_len + completion_len),
            "masks": [-100] * prompt_len + [7] * completion_len}


def test_summary_stats_of_a_hand_made_file(tmp_path):
    # group 1: scores 1, 0, -1 ; completion lengths 2, 4, 6 tokens
    # group 2: scores 1, 1      ; completion lengths 10, 0 (all masked: unknown) tokens
    g1 = [_tokens(3, 2), _tokens(3, 4), _tokens(3, 6)]
    g2 = [_tokens(5, 10), _tokens(5, 0)]
    records = [
        {"messages": [_chat("q1", a) for a in "abc"], "scores": [1.0, 0.0, -1.0],
         "tokens": [t["tokens"] for t in g1], "masks": [t["masks"] for t in g1]},
        {"messages": [_chat("q2", a) for a in "de"], "scores": [1.0, 1.0],
         "tokens": [t["tokens"] for t in g2], "masks": [t["masks"] for t in g2]},
    ]
    stats = pooled_stats(records)
    assert stats == ScoreStats(groups=2, rollouts=5, scored=5, mean_score=2 / 5,
                               share_correct=3 / 5, mean_length=22 / 4, min_length=2, max_length=10)
    src = tmp_path / "stats.jsonl"
    _write(src, records)
    page = generate_html(src).read_text()
    assert re.search(r"This file: 2 group\(s\) · 5 rollouts · mean score 0.4 · 60% correct "
                     r"\(score &gt; 0\) · completion tokens mean 5.5 \(min 2, max 10\)", page)
    # per group
    assert "3 rollouts · mean score 0 · 33% correct (score &gt; 0) · completion tokens mean 4.0 " \
           "(min 2, max 6)" in page
    assert "2 rollouts · mean score 1 · 100% correct (score &gt; 0) · completion tokens mean 10.0" in page


def test_correct_means_a_positive_numeric_score():
    assert [is_correct(s) for s in (1, 0.01, 0, -1, "x", None, float("nan"), True)] == [
        True, True, False, False, False, False, False, True]
    empty = ScoreStats.of(["n/a"], [None])
    assert empty.mean_score is None and empty.share_correct is None and empty.scored == 0
    assert "no numeric scores" in empty.describe()


def test_missing_input_and_cli(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        generate_html(tmp_path / "nope.jsonl")
    src = tmp_path / "g.jsonl"
    _write(src, [{"messages": ["hello"], "scores": [0]}])
    proc = subprocess.run([sys.executable, "-m", "atroposlib.frontend.jsonl2html", str(src), "-o",
                           str(tmp_path / "x.html")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "x.html").read_text().count("atr-score atr-zero") >= 1
    bad = subprocess.run([sys.executable, "-m", "atroposlib.frontend.jsonl2html",
                          str(tmp_path / "missing.jsonl")], capture_output=True, text=True)
    assert bad.returncode == 1 and "does not exist" in bad.stderr
