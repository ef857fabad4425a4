"""atropos-sft-gen against a real run-api subprocess."""

import os
import subprocess
import sys

import httpx
import orjson
import pytest

from tests.fixtures.api_server import free_port, start_run_api
from tests.tools.groups import load_tokenizer, make_group

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def sft_gen(capsys):
    """Run atropos-sft-gen's main() in-process (fast); returns code and captured output."""
    from atroposlib.cli.sft import main

    def run(*args):
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # --help / argparse errors
            code = exc.code
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return run


def sft_gen_subprocess(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "atroposlib.cli.sft", *map(str, args)],
                          capture_output=True, text=True, env=ENV, timeout=timeout)


def post(api, group):
    response = httpx.post(api.url + "/scored_data", json=group, headers=api.headers, timeout=10)
    assert response.status_code == 200, response.text


@pytest.fixture
def api_with_groups(bundled_model_dir):
    tok = load_tokenizer(bundled_model_dir)
    api = start_run_api()
    try:
        post(api, make_group(tok, "2+2?", ["4", "four", "5"], [1.0, 0.5, 0.0]))
        post(api, make_group(tok, "3+3?", ["6", "7", "8"], [1.0, 0.0, 0.0], with_messages=False))
        yield api
    finally:
        api.stop()


def lines(path):
    return [orjson.loads(x) for x in path.read_text().splitlines()]


def test_sft_gen_writes_chat_lines_and_leaves_the_queue_alone(api_with_groups, tmp_path, bundled_model_dir):
    out = tmp_path / "sft.jsonl"
    r = sft_gen_subprocess(out, "--api-url", api_with_groups.url, "--num-seqs-to-save", 2,
                "--tokenizer", bundled_model_dir, "--quiet")
    assert r.returncode == 0, r.stderr
    rows = lines(out)
    assert [row["score"] for row in rows] == [1.0, 0.5]
    assert rows[0]["messages"][-1] == {"role": "assistant", "content": "4"}
    assert "wrote 2 lines from 1 of 1 groups" in r.stderr
    # it did not take anything: both groups still queued for the trainer, no registration
    status = httpx.get(api_with_groups.url + "/status").json()
    assert status["queue_size"] == 2
    assert httpx.get(api_with_groups.url + "/info").json()["batch_size"] == -1


def test_sft_gen_text_format_decodes_token_only_groups(sft_gen, api_with_groups, tmp_path, bundled_model_dir):
    out = tmp_path / "sft.jsonl"
    r = sft_gen(out, "--api-url", api_with_groups.url, "--num-seqs-to-save", 10, "--format", "text",
                "--tokenizer", bundled_model_dir, "--idle-timeout", 1, "--poll-interval", 0.2,
                "--quiet")
    assert r.returncode == 0, r.stderr
    rows = lines(out)
    assert [(row["completion"], row["score"]) for row in rows] == [
        ("4<|im_end|>", 1.0), ("four<|im_end|>", 0.5), ("6<|im_end|>", 1.0)]
    assert all("<|im_start|>user" in row["prompt"] for row in rows)
    assert "stopped before --num-seqs-to-save 10" in r.stderr


def test_sft_gen_legacy_and_append(sft_gen, api_with_groups, tmp_path, bundled_model_dir):
    out = tmp_path / "sft.jsonl"
    common = ["--api-url", api_with_groups.url, "--tokenizer", bundled_model_dir, "--quiet",
              "--format", "legacy", "--allow-negative-scores", "--save-top-n-per-group", 1]
    r = sft_gen(out, *common, "--num-seqs-to-save", 2)
    assert r.returncode == 0, r.stderr
    assert [set(row) for row in lines(out)] == [{"prefix", "completion", "score"}] * 2
    r = sft_gen(out, *common, "--num-seqs-to-save", 1)
    assert r.returncode == 1 and "--append-to-previous" in r.stderr
    r = sft_gen(out, *common, "--num-seqs-to-save", 1, "--append-to-previous", "--after", 1)
    assert r.returncode == 0, r.stderr
    assert [row["completion"] for row in lines(out)] == ["4<|im_end|>", "6<|im_end|>", "6<|im_end|>"]
    r = sft_gen(out, "--api-url", api_with_groups.url, "--format", "chat", "--append-to-previous")
    assert r.returncode == 1 and "mixing them" in r.stderr


def test_sft_gen_reports_auth_and_connection_errors(sft_gen, tmp_path):
    api = start_run_api("--api-key", "s3cret")
    try:
        r = sft_gen(tmp_path / "a.jsonl", "--api-url", api.url, "--quiet")
        assert r.returncode == 1 and "401" in r.stderr
        post(api, {"tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [1.0],
                   "messages": [[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]]})
        r = sft_gen(tmp_path / "b.jsonl", "--api-url", api.url, "--api-key", "s3cret",
                    "--num-seqs-to-save", 1, "--quiet")
        assert r.returncode == 0, r.stderr
    finally:
        api.stop()


def test_sft_gen_help_documents_noop_flags(sft_gen):
    r = sft_gen("--help")
    assert r.returncode == 0
    for flag in ("--tasks-per-step", "--group-size", "--max-token-len"):
        assert flag in r.stdout
    assert "ignored" in r.stdout and "/observe" in r.stdout


def test_sft_gen_ctrl_c_keeps_lines_and_reports(api_with_groups, tmp_path):
    import signal
    import time

    out = tmp_path / "sft.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "atroposlib.cli.sft", str(out), "--api-url",
                             api_with_groups.url, "--num-seqs-to-save", "50", "--quiet",
                             "--poll-interval", "0.2"], stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (out.exists() and out.read_text().count("\n") >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted; wrote 2 lines" in err
    assert len(lines(out)) == 2


def test_sft_gen_failed_run_leaves_no_file_and_the_next_run_works(sft_gen, api_with_groups, tmp_path):
    out = tmp_path / "sft.jsonl"
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the pre-flight check fails
    r = sft_gen(out, "--api-url", dead, "--quiet")
    assert r.returncode == 1 and "run-api is not reachable" in r.stderr
    assert not out.exists()  # no empty file to block the retry
    guarded = start_run_api("--api-key", "s3cret")  # reachable: the run fails on its first poll
    try:
        r = sft_gen(out, "--api-url", guarded.url, "--quiet")
    finally:
        guarded.stop()
    assert r.returncode == 1 and "401" in r.stderr
    assert not out.exists()
    r = sft_gen(out, "--api-url", api_with_groups.url, "--num-seqs-to-save", 2, "--quiet")
    assert r.returncode == 0, r.stderr
    assert len(out.read_text().splitlines()) == 2


def test_sft_gen_suggests_the_flag_before_the_usage(sft_gen):
    r = sft_gen("--save-top-n-per-grup", 2)
    assert r.returncode == 2
    first, rest = r.stderr.split("\n", 1)
    assert "did you mean --save-top-n-per-group?" in first
    assert "usage: atropos-sft-gen" in rest


def test_sft_gen_defaults_to_the_bundled_tokenizer_and_local_api():
    from atroposlib.inference.bundled import bundled_model_dir
    from atroposlib.tools.cli_common import build_parser

    args = build_parser("sft").parse_args([])
    assert args.tokenizer == str(bundled_model_dir())
    assert args.api_url == "http://127.0.0.1:8000"
