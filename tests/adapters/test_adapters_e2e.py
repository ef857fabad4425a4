"""verifiers, OpenEnv and Gymnasium environments served into a real run-api against real vLLM.

Each env runs as ``atropos-env PREFIX:SPEC serve`` (a child process) with the bundled model
on the session's vLLM; a trainer client pulls a batch, which is decoded and checked:

* every score equals the environment's own scoring applied to the decoded completion (the
  verifiers task's ``@vf.reward`` function, OpenEnv's own ``step`` rewards, Gymnasium's own
  return);
* masks cover exactly the model's tokens (each trained span is one model turn, ending with
  the end-of-turn token or cut at max_tokens), every other position is masked;
* the logprobs are the sampler's: vLLM re-scores the exact token ids and agrees.

Heavy: run under ``flock /tmp/atropos-heavy.lock``.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from atroposlib.api.client import AtroposClient
from atroposlib.api.models import IGNORE_INDEX, Registration
from tests.fixtures.api_server import start_run_api
from tests.fixtures.processes import stop_process

pytestmark = pytest.mark.e2e
pytest.importorskip("verifiers.v1")
REPO = Path(__file__).resolve().parents[2]
GROUP = 4


def serve_one_batch(name, vllm, tmp_path, *extra, batch_size=GROUP, timeout=420):
    """Serve ``name`` into a fresh run-api; return the first batch (list of groups)."""
    api = start_run_api()
    log = tmp_path / f"{re.sub(r'[^a-z0-9]+', '_', name.lower())}.log"
    proc = None
    try:
        trainer = AtroposClient(api.url)
        trainer.register(Registration(
            wandb_group="g", wandb_project="p", batch_size=batch_size, max_token_len=2048,
            checkpoint_dir=str(tmp_path / "ckpt"), save_checkpoint_interval=-1,
            starting_step=0, num_steps=10))
        proc = subprocess.Popen(
            [sys.executable, "-m", "atroposlib.cli.env", name, "serve",
             "--env.tokenizer_name", str(vllm.model_dir), "--env.rollout_server_url", api.url,
             "--env.group_size", str(GROUP), "--env.use_wandb", "false",
             "--env.ensure_scores_are_not_same", "false",
             "--openai.base_url", vllm.base_url, "--openai.model_name", vllm.model_name,
             "--openai.server_type", "vllm", "--openai.api_key", "x", *extra],
            cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        batch, deadline = None, time.monotonic() + timeout
        while batch is None and time.monotonic() < deadline and proc.poll() is None:
            batch = trainer.get_batch()
            time.sleep(0.5)
        assert batch, log.read_text(errors="replace")[-4000:]
        return batch
    finally:
        stop_process(proc, signal.SIGTERM, timeout=60, group=True)
        api.stop()


def spans(masks):
    """``[(start, end), ...]`` runs of trained positions."""
    out, start = [], None
    for i, m in enumerate([*masks, IGNORE_INDEX]):
        if m != IGNORE_INDEX and start is None:
            start = i
        elif m == IGNORE_INDEX and start is not None:
            out.append((start, i))
            start = None
    return out


def check_tokens(group, tokenizer, vllm, max_tokens):
    """Masks cover the model's turns only; logprobs are what vLLM gives those exact tokens."""
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    replies = []
    for tokens, masks, logprobs in zip(group["tokens"], group["masks"],
                                       group["inference_logprobs"], strict=True):
        assert len(tokens) == len(masks) == len(logprobs)
        turns = spans(masks)
        assert turns, "no trained tokens"
        for a, b in turns:
            assert masks[a:b] == tokens[a:b]
            assert tokens[b - 1] == end_of_turn or b - a == max_tokens
            before = tokenizer.decode(tokens[max(0, a - 3):a])
            assert before.endswith("assistant\n"), before  # a turn starts after the template
        assert all(lp == 1.0 for lp, m in zip(logprobs, masks, strict=True) if m == IGNORE_INDEX)
        rescored = httpx.post(f"{vllm.base_url}/completions", timeout=120, json={
            "model": vllm.model_name, "prompt": tokens, "max_tokens": 1, "echo": True,
            "logprobs": 0, "temperature": 0.0}).json()["choices"][0]["logprobs"]["token_logprobs"]
        diffs = [abs(logprobs[i] - rescored[i]) for a, b in turns for i in range(a, b)]
        assert max(diffs) < 0.05 and sum(diffs) / len(diffs) < 5e-3, max(diffs)
        replies.append([tokenizer.decode(tokens[a:b], skip_special_tokens=True) for a, b in turns])
    return replies


def served_rollouts(name, vllm, tokenizer, tmp_path, max_tokens, *extra):
    """Serve ``name`` (``--env.max_tokens max_tokens``) and check every group's tokens.

    Yields ``(tokens, turns, score)`` per rollout of the first batch, ``turns`` being the
    decoded model turns (see :func:`check_tokens`).
    """
    batch = serve_one_batch(name, vllm, tmp_path, "--env.max_tokens", str(max_tokens), *extra)
    for group in batch:
        replies = check_tokens(group, tokenizer, vllm, max_tokens)
        yield from zip(group["tokens"], replies, group["scores"], strict=True)


@pytest.fixture(scope="module")
def tokenizer(bundled_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(bundled_model_dir))


def test_verifiers_single_turn_served_into_run_api(vllm_server, tokenizer, tmp_path):
    from tests.adapters.vf_reverse.taskset import ReverseData, ReverseTask

    for tokens, turns, score in served_rollouts("verifiers:tests.adapters.vf_reverse", vllm_server,
                                                tokenizer, tmp_path, 24):
        assert len(turns) == 1  # single-turn
        word = re.search(r"Reverse: (\w+)", tokenizer.decode(tokens)).group(1)
        task = ReverseTask(ReverseData(idx=0, prompt=f"Reverse: {word}", answer=word[::-1]))
        expected = asyncio.run(task.similarity(SimpleNamespace(last_reply=turns[0])))
        assert score == pytest.approx(expected)


def test_verifiers_multi_turn_served_into_run_api(vllm_server, tokenizer, tmp_path):
    from tests.adapters.vf_echo_chat.taskset import EchoData, EchoTask

    for tokens, turns, score in served_rollouts("verifiers:tests.adapters.vf_echo_chat", vllm_server,
                                                tokenizer, tmp_path, 12):
        # the user's turns only: a sampled reply may itself say "single word: X"
        words = re.findall(r"<\|im_start\|>user\nReply with the single word: (\w+)", tokenizer.decode(tokens))
        assert len(turns) == len(words) >= 2  # one trained span per user turn
        task = EchoTask(EchoData(idx=0, prompt=None, info={"words": words}))
        trace = SimpleNamespace(assistant_messages=[SimpleNamespace(content=t) for t in turns])
        assert score == pytest.approx(asyncio.run(task.echoed(trace)))


def test_openenv_server_served_into_run_api(vllm_server, tokenizer, tmp_path):
    pytest.importorskip("openenv")
    from tests.adapters.openenv_word.server import WordAction, WordEnvironment

    for tokens, turns, score in served_rollouts("openenv:tests.adapters.openenv_word.server:app",
                                                vllm_server, tokenizer, tmp_path, 12,
                                                "--env.max_turns", "3"):
        env = WordEnvironment()  # the server's own rewards, replayed on the decoded replies
        seed = {"apple": 0, "river": 1, "stone": 2, "cloud": 3}[
            re.search(r"Say the word (\w+)", tokenizer.decode(tokens)).group(1)]
        env.reset(seed=seed)
        total = 0.0
        for reply in turns:
            obs = env.step(WordAction(message=reply.strip()))
            total += obs.reward
            if obs.done:
                break
        assert score == pytest.approx(total)


def test_gymnasium_env_by_id_served_into_run_api(vllm_server, tokenizer, tmp_path):
    import gymnasium

    names = ["left", "down", "right", "up"]
    rollouts = served_rollouts("gym:FrozenLake-v1", vllm_server, tokenizer, tmp_path, 8,
                               "--env.max_turns", "3", "--env.gym_kwargs", '{"is_slippery": false}',
                               "--env.action_names", json.dumps(names),
                               "--env.invalid_action_penalty", "-0.1")
    for _, turns, score in rollouts:
        game = gymnasium.make("FrozenLake-v1", is_slippery=False)
        game.reset(seed=0)
        total = 0.0
        for reply in turns:
            found = re.findall(r"\b(left|down|right|up)\b", reply.lower())
            if not found:
                total -= 0.1
                continue
            _, reward, terminated, truncated, _ = game.step(names.index(found[-1]))
            total += reward
            if terminated or truncated:
                break
        assert score == pytest.approx(total)


@pytest.mark.timeout(1200)
def test_short_grpo_run_on_a_verifiers_env_through_atropos_launch(vllm_server, tmp_path):
    import yaml

    from atroposlib.launch.config import load_config
    from atroposlib.launch.orchestration import Launcher

    config = yaml.safe_load((Path(__file__).parent / "launch-vf-reverse.yaml").read_text())
    run_dir = tmp_path / "run"
    config["run_dir"] = str(run_dir)
    config["trainer"].update(model=str(vllm_server.model_dir), vllm_url=vllm_server.base_url,
                             served_model_name=vllm_server.model_name)
    config["envs"][0]["script"] = str(Path(__file__).parent / "vf_reverse_env.py")
    path = tmp_path / "launch.yaml"
    path.write_text(yaml.safe_dump(config))
    try:
        code = Launcher(load_config(path)).run()
        logs = run_dir / "logs"
        assert code == 0, (logs / "trainer.log").read_text()[-3000:] + (
            logs / "vf_reverse.log").read_text()[-3000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["steps"] == 2 and summary["stopped"] == "completed"
        assert 0.0 <= summary["eval_accuracy_before"] <= 1.0
        steps = [m for m in (json.loads(line) for line in
                             (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in m]
        assert [m["step"] for m in steps] == [1, 2]
        assert all(m["sequences"] == 8 and m["trained_tokens"] > 0 for m in steps)
    finally:
        httpx.post(f"{vllm_server.root_url}/collective_rpc", timeout=300, json={
            "method": "reload_weights", "kwargs": {"weights_path": str(vllm_server.model_dir)}})
        httpx.post(f"{vllm_server.root_url}/reset_prefix_cache", timeout=60)
