"""Injected rollout faults on the real loop: real vLLM, an env served as a subprocess, a real run-api.

Three env processes in turn inject faults (``ATROPOS_FAULTS``, kinds kill, timeout and
corrupt mixed) into 10%, 50% and 90% of their rollout attempts and send their groups to one
run-api (``--db``); this test pulls ``/batch`` as the trainer does. Each env is killed with
SIGKILL, then run-api is, and run-api is restarted on the same file.

Policies: 10% keeps the default ``retry`` (whole groups; a faulted member is rolled out again);
50% uses ``shrink`` (groups of 2 to 4 completed members); 90% uses ``shrink`` with
``min_completed_rollouts`` 1, since two of four members completing is rare at 90% (5% of groups)
and the point is that the survivors that exist reach the trainer clean.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from atroposlib.api.ledger import completion_tokens
from atroposlib.envs.faults import OUTCOME_KIND
from example_trainer.data import batch_to_sequences, group_advantages
from tests.env_runtime.test_serve import _register_trainer
from tests.fixtures.api_server import pull_batches, start_run_api

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
#: (fault rate, seed, failed_rollout_policy, min_completed_rollouts); the 10% seed puts all three
#: kinds in the first 6 groups, so a short run sees each
RATES = [(0.1, 6, "retry", 2), (0.5, 5, "shrink", 2), (0.9, 9, "shrink", 1)]
BATCHES_PER_RATE = 2
OUTCOME_KEYS = ("rollout_ids", "attempts", "excluded")


def _closes(ledger: dict) -> bool:
    r, t = ledger["rollouts"], ledger["tokens"]
    return (ledger["closes"] and r["sampled"] == r["completed"] + r["masked"] + r["failed"]
            and t["sampled"] == t["served"] + t["dropped_stale"] + t["dropped_filter"]
            + t["dropped_masked"] + t["queued"])


def _start_env(vllm_server, api_url: str, rate: float, seed: int, policy: str,
               min_completed: int, log: Path, faults_log: Path) -> subprocess.Popen:
    spec = f"rate={rate},kinds=kill+timeout+corrupt,seed={seed},log={faults_log}"
    return subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.sample_envs", "SingleRolloutEnv", "serve",
         "--openai.server_type", "vllm", "--openai.base_url", vllm_server.base_url,
         "--openai.model_name", vllm_server.model_name,
         "--env.tokenizer_name", str(vllm_server.model_dir), "--env.group_size", "4",
         "--env.rollout_server_url", api_url, "--env.use_wandb", "false",
         "--env.ensure_scores_are_not_same", "false", "--env.rollout_timeout", "10",
         "--env.max_num_workers", "4",
         "--env.failed_rollout_policy", policy,
         "--env.min_completed_rollouts", str(min_completed)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "ATROPOS_FAULTS": spec},
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )


def _kill_9(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def _check_served_group(group: dict, injected: dict[tuple[str, int], str]) -> int:
    """Assert one served group carries completed members only; return its failed members."""
    n = len(group["tokens"])
    # every member the trainer gets is named, and none is an injected (failed) attempt
    assert len(group["scores"]) == len(group["rollout_ids"]) == len(group["attempts"]) == n
    kept = set(zip(group["rollout_ids"], group["attempts"], strict=True))
    assert not kept & set(injected), kept & set(injected)
    failed = [m for m in group.get("excluded") or () if m["outcome"] == "failed"]
    for member in failed:
        # a failed member has no score and no sequence: nothing fabricated reaches the trainer
        assert "score" not in member and "tokens" not in member and "masks" not in member
        key = (member["rollout_id"], member["attempt"])
        if key in injected:
            assert member["kind"] == OUTCOME_KIND[injected[key]], member
        else:  # a real failure on a loaded machine, never an injected one in disguise
            assert "injected fault" not in member.get("message", ""), member
    return len(failed)


def _check_advantages(batch: list[dict]) -> None:
    """The trainer's advantages of a served batch equal those of its groups made clean."""
    clean = [{k: v for k, v in g.items() if k not in OUTCOME_KEYS} for g in batch]
    for scale in (True, False):
        seqs, stats = batch_to_sequences(batch, scale_advantages=scale)
        clean_seqs, clean_stats = batch_to_sequences(clean, scale_advantages=scale)
        assert [s.advantages for s in seqs] == [s.advantages for s in clean_seqs]  # bit for bit
        assert [s.input_ids for s in seqs] == [s.input_ids for s in clean_seqs]
        expected = [a for g in batch for a in group_advantages(g["scores"], scale=scale)]
        assert [s.advantages[0] for s in seqs] == expected
        assert stats.scores == clean_stats.scores


def test_injected_faults_never_reach_the_trainer_and_the_ledger_closes(vllm_server, tmp_path):
    db = tmp_path / "q.db"
    api = start_run_api(db=db)
    injected: dict[tuple[str, int], str] = {}
    served_tokens = 0
    report = []
    try:
        trainer = _register_trainer(api.url, tmp_path, batch_size=8)
        for rate, seed, policy, min_completed in RATES:
            log, faults_log = tmp_path / f"env-{rate}.log", tmp_path / f"faults-{rate}.jsonl"
            proc = _start_env(vllm_server, api.url, rate, seed, policy, min_completed, log,
                              faults_log)
            try:
                batches = pull_batches(trainer, BATCHES_PER_RATE, timeout=240, proc=proc)
            finally:
                _kill_9(proc)  # kill -9 of the env, mid-run
            output = log.read_text(errors="replace")
            assert batches, f"no batch at rate {rate}:\n{output[-3000:]}"
            faults = [json.loads(line) for line in faults_log.read_text().splitlines()]
            injected |= {(f["rollout_id"], f["attempt"]): f["kind"] for f in faults}
            assert faults, f"no fault injected at rate {rate}:\n{output[-3000:]}"
            failed = 0
            for batch in batches:
                failed += sum(_check_served_group(g, injected) for g in batch)
                _check_advantages(batch)
                served_tokens += sum(completion_tokens(g["masks"]) for g in batch)
            if policy == "shrink":
                assert failed > 0, f"no served group at rate {rate} carried a failed member"
            ledger = httpx.get(api.url + "/ledger", timeout=30).json()
            assert _closes(ledger), ledger
            assert ledger["tokens"]["served"] == served_tokens
            report.append((rate, len(faults), failed, ledger["rollouts"]))
        assert set(injected.values()) == {"kill", "timeout", "corrupt"}
        before = httpx.get(api.url + "/ledger", timeout=30).json()
        assert before["rollouts"]["failed"] > 0
        api.kill()  # kill -9 of run-api
        api = start_run_api(db=db, port=api.port)
        after = httpx.get(api.url + "/ledger", timeout=30).json()
        assert after == before and _closes(after)
        trainer.get_batch()  # it goes on serving from the same journal
        assert _closes(httpx.get(api.url + "/ledger", timeout=30).json())
        assert "Traceback" not in api.log()
    finally:
        api.stop()
    print("rate, faults injected, failed members served in excluded, ledger rollouts:", report)
