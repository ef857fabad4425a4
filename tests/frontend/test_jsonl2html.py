"""jsonl2html renders groups readably and strips script injection (upstream had XSS)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from atroposlib.frontend.jsonl2html import generate_html


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "not json\n")


def test_renders_groups_scores_and_roles(tmp_path):
    src = tmp_path / "groups.jsonl"
    _write(src, [
        {"messages": [[{"role": "user", "content": "What is **2+2**?"},
                       {"role": "assistant", "content": "It is 4"}],
                      "plain string completion"],
         "scores": [1.0, -0.5]},
        {"tokens": [[1]], "scores": [0.0]},  # no messages: skipped
    ])
    out = generate_html(src)
    assert out == tmp_path / "groups.html"
    page = out.read_text()
    assert "Group 1" in page and "Group 2" not in page
    assert "<strong>2+2</strong>" in page  # markdown rendered
    assert "It is 4" in page and "plain string completion" in page
    assert "reward-positive" in page and "reward-negative" in page
    assert "2 line(s) skipped" in page


def test_script_injection_is_removed(tmp_path):
    src = tmp_path / "evil.jsonl"
    evil = '<script>alert("x")</script><img src=x onerror="alert(1)"><a href="javascript:alert(2)">l</a>'
    _write(src, [{"messages": [[{"role": "<b onmouseover=alert(3)>user</b>", "content": evil}]],
                  "scores": ['<script>alert(4)</script>']}])
    page = generate_html(src, tmp_path / "out" / "evil.html").read_text()
    assert "<script>alert" not in page
    assert "onerror" not in page and "<b onmouseover" not in page
    assert "javascript:" not in page
    assert "&lt;script&gt;alert(4)" in page  # the score is escaped, not executed


def test_missing_input_and_cli(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        generate_html(tmp_path / "nope.jsonl")
    src = tmp_path / "g.jsonl"
    _write(src, [{"messages": ["hello"], "scores": [0]}])
    proc = subprocess.run([sys.executable, "-m", "atroposlib.frontend.jsonl2html", str(src), "-o",
                           str(tmp_path / "x.html")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "x.html").read_text().count("reward-zero") >= 1
    bad = subprocess.run([sys.executable, "-m", "atroposlib.frontend.jsonl2html",
                          str(tmp_path / "missing.jsonl")], capture_output=True, text=True)
    assert bad.returncode == 1 and "does not exist" in bad.stderr
