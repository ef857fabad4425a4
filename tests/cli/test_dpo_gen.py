"""atropos-dpo-gen against a real run-api subprocess."""

import os
import subprocess
import sys

import httpx
import orjson
import pytest

from tests.fixtures.api_server import free_port, start_run_api
from tests.tools.groups import load_tokenizer, make_group

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def api_with_groups(bundled_model_dir):
    tok = load_tokenizer(bundled_model_dir)
    api = start_run_api()
    try:
        for i in range(3):
            group = make_group(tok, f"{i}+1?", [str(i + 1), "x", "y", "z"], [1.0, 0.0, 0.2, 0.9])
            r = httpx.post(api.url + "/scored_data", json=group, timeout=10)
            assert r.status_code == 200, r.text
        yield api
    finally:
        api.stop()


def dpo_gen(*args):
    from atroposlib.cli.dpo import main

    return main([str(a) for a in args])


def rows(path):
    return [orjson.loads(x) for x in path.read_text().splitlines()]


def test_dpo_gen_pairs_and_is_reproducible(api_with_groups, tmp_path, capsys):
    # per group: chosen 1.0 and 0.9; pool = 3 lowest {0.0, 0.2, 0.9}; margin 0.5 -> 2 pairs
    for name in ("a.jsonl", "b.jsonl"):
        assert dpo_gen(tmp_path / name, "--api-url", api_with_groups.url, "--seed", 1,
                       "--num-seqs-to-save", 6, "--quiet") == 0
    a, b = rows(tmp_path / "a.jsonl"), rows(tmp_path / "b.jsonl")
    assert a == b and len(a) == 6
    for row in a:
        assert row["score_chosen"] - row["score_rejected"] > 0.5
        assert row["prompt"][-1]["role"] == "user" and row["chosen"][0]["role"] == "assistant"
    assert "wrote 6 lines from 3 of 3 groups" in capsys.readouterr().err
    # still all queued for the trainer
    assert httpx.get(api_with_groups.url + "/status").json()["queue_size"] == 3


def test_dpo_gen_legacy_layout_and_margin(api_with_groups, tmp_path, bundled_model_dir):
    out = tmp_path / "legacy.jsonl"
    assert dpo_gen(out, "--api-url", api_with_groups.url, "--format", "legacy", "--tokenizer",
                   bundled_model_dir, "--minimum-score-diff-max-min", 0.85, "--idle-timeout", 0.5,
                   "--poll-interval", 0.1, "--quiet") == 0
    got = rows(out)
    # only 1.0 vs 0.0 clears a 0.85 margin: one pair per group
    assert [set(r) for r in got] == [{"prefix", "pos", "score", "neg"}] * 3
    assert [(r["pos"], r["neg"], r["score"]) for r in got] == [
        (f"{i + 1}<|im_end|>", "x<|im_end|>", 1.0) for i in range(3)]


def test_dpo_gen_console_script_runs(api_with_groups, tmp_path):
    out = tmp_path / "dpo.jsonl"
    args = [str(out), "--api-url", api_with_groups.url, "--env-id", "5", "--idle-timeout", "0.5",
            "--quiet"]
    r = subprocess.run([sys.executable, "-m", "atroposlib.cli.dpo", *args], capture_output=True,
                       text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "wrote 0 lines from 0 of 0 groups" in r.stderr  # no env 5 in this run
    assert not out.exists() and "no file written" in r.stderr  # an empty file would block a rerun


def test_dpo_gen_leaves_no_helper_thread_behind(api_with_groups, tmp_path):
    # tqdm's monitor thread is a known cause of hangs at interpreter exit: the tools start none
    code = ("import sys, threading; from atroposlib.cli.dpo import main; "
            "code = main(sys.argv[1:]); print(sorted(t.name for t in threading.enumerate())); "
            "sys.exit(code)")
    args = [str(tmp_path / "d.jsonl"), "--api-url", api_with_groups.url, "--num-seqs-to-save", "2"]
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['MainThread']"


def test_help_does_not_import_heavy_libraries():
    code = ("import sys; from atroposlib.tools.cli_common import build_parser; "
            "build_parser('sft').format_help(); build_parser('dpo').format_help(); "
            "heavy = {'torch', 'transformers', 'datasets', 'gradio'} & set(sys.modules); "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_dpo_gen_failed_run_leaves_no_file(tmp_path, capsys):
    from atroposlib.cli.dpo import main
    out = tmp_path / "dpo.jsonl"
    assert main([str(out), "--api-url", f"http://127.0.0.1:{free_port()}", "--quiet"]) == 1
    assert "run-api is not reachable" in capsys.readouterr().err
    assert not out.exists()
    guarded = start_run_api("--api-key", "s3cret")  # reachable: the run fails on its first poll
    try:
        assert main([str(out), "--api-url", guarded.url, "--quiet"]) == 1
    finally:
        guarded.stop()
    assert "401" in capsys.readouterr().err
    assert not out.exists()
