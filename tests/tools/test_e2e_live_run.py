"""End to end: a real env on real vLLM feeds run-api; sft/dpo-gen write datasets while a trainer drains."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from atroposlib.api.client import AtroposClient
from tests.fixtures.api_server import start_run_api

ROOT = Path(__file__).resolve().parents[2]
# PYTHONFAULTHANDLER: a tool that does not exit in time is sent SIGABRT, which makes it print
# the stack of every thread, so a hang is diagnosable from the test report alone.
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "PYTHONFAULTHANDLER": "1"}
TOOL_TIMEOUT_S = 600  # sft+dpo together: ~15 s idle, 30 s in a loaded CI run


def _wait_for_tool(kind: str, proc: subprocess.Popen, deadline: float) -> str:
    """Wait for a tool to exit by ``deadline``; return its stderr, or fail with its thread stacks."""
    try:
        _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        return err
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"atropos-{kind}-gen did not exit within {TOOL_TIMEOUT_S} s; stderr and thread "
                    f"stacks:\n{err[-8000:]}")


@pytest.mark.e2e
def test_datasets_from_a_live_run_on_real_vllm(vllm_server, tmp_path):
    api = start_run_api()
    procs = []
    stop = threading.Event()
    trainer_got: list[dict] = []
    try:
        reg = {"wandb_group": "g", "wandb_project": "p", "batch_size": 8, "max_token_len": 2048,
               "checkpoint_dir": str(tmp_path), "save_checkpoint_interval": 10, "starting_step": 0,
               "num_steps": 100}
        httpx.post(api.url + "/register", json=reg).raise_for_status()

        def trainer():
            with AtroposClient(api.url) as client:
                while not stop.is_set():
                    batch = client.get_batch()
                    if batch:
                        trainer_got.extend(batch)
                    else:
                        time.sleep(0.2)

        threading.Thread(target=trainer, daemon=True).start()
        procs.append(subprocess.Popen(
            [sys.executable, str(ROOT / "environments" / "arithmetic_server.py"), "serve",
             "--env.rollout_server_url", api.url, "--env.group_size", "4", "--env.max_tokens", "16",
             "--env.difficulty", "1", "--env.max_num_workers", "2", "--env.tokenizer_name",
             str(vllm_server.model_dir), "--openai.base_url", vllm_server.base_url,
             "--openai.model_name", vllm_server.model_name, "--openai.server_type", "vllm"],
            stdout=open(tmp_path / "env.log", "wb"), stderr=subprocess.STDOUT, env=ENV,
            start_new_session=True))
        # token-only groups (the env sends no messages): text layout decoded with the tokenizer
        common = ["--api-url", api.url, "--tokenizer", str(vllm_server.model_dir), "--quiet",
                  "--poll-interval", "0.2", "--idle-timeout", "240"]
        tools = {
            "sft": [tmp_path / "sft.jsonl", "--num-seqs-to-save", "3", *common],
            "dpo": [tmp_path / "dpo.jsonl", "--num-seqs-to-save", "2", "--seed", "0", *common],
        }
        for kind, args in tools.items():
            procs.append(subprocess.Popen(
                [sys.executable, "-m", f"atroposlib.cli.{kind}", *map(str, args)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV))
        t0 = time.monotonic()
        deadline = t0 + TOOL_TIMEOUT_S
        for kind, proc in zip(tools, procs[1:], strict=True):
            err = _wait_for_tool(kind, proc, deadline)
            assert proc.returncode == 0, err + (tmp_path / "env.log").read_text()[-3000:]
            print(f"tool done after {time.monotonic() - t0:.1f} s: {err.strip()}")

        sft = [orjson.loads(x) for x in (tmp_path / "sft.jsonl").read_text().splitlines()]
        dpo = [orjson.loads(x) for x in (tmp_path / "dpo.jsonl").read_text().splitlines()]
        assert len(sft) == 3 and len(dpo) == 2
        assert all(r["score"] > 0 for r in sft)
        assert all(r["score_chosen"] - r["score_rejected"] > 0.5 for r in dpo)
        # every line is exactly the text of a sequence the env produced. (Compare text, not
        # re-encoded ids: a sampled completion may be a non-canonical tokenization, e.g. "1"+"2"
        # for "12", which re-encodes differently; CI hit that once.)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(vllm_server.model_dir)
        observed = httpx.get(api.url + "/observe", params={"limit": 1000}).json()["groups"]
        texts = {tok.decode(t, skip_special_tokens=False)
                 for g in observed for t in g["group"]["tokens"]}
        for r in sft:
            assert "<|im_start|>user\nWhat is" in r["prompt"]
            assert r["prompt"].endswith("<|im_start|>assistant\n")
            assert r["prompt"] + r["completion"] in texts
        for r in dpo:
            assert r["prompt"].endswith("<|im_start|>assistant\n")
            for side in ("chosen", "rejected"):
                assert r["prompt"] + r[side] in texts
        # the trainer was served groups all along, none of them twice
        stop.set()
        cursors_served = [tuple(map(tuple, g["tokens"])) for g in trainer_got]
        assert trainer_got and len(cursors_served) == len(set(cursors_served))
    finally:
        stop.set()
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        api.stop()
