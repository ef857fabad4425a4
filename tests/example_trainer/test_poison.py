"""Poison never crashes the trainer: the probe's bad groups through a real run-api, a tiny Llama."""

from __future__ import annotations

import json
import re

import pytest

from atroposlib.api.client import AtroposClient
from atroposlib.errors import ApiRejectedError
from example_trainer.batch_checks import MAX_ABS_SCORE, BatchGuard, check_group
from example_trainer.config import TrainerConfig
from example_trainer.grpo import train
from tests.example_trainer.test_grpo_loop import _group, needs_tokenizer, tiny_model  # noqa: F401

VOCAB = 49152  # SmolLM2's tokenizer, and so the tiny Llama's embedding rows
MAX_LEN = 64


def _plain(seed: int) -> dict:
    """A good group of 4 sequences of 12 tokens (prompt 6, completion 6)."""
    g = _group(seed)
    return {"tokens": g["tokens"], "masks": g["masks"], "scores": g["scores"]}


def _poison(case: str) -> dict:
    """A group of 4 with the probe's defect ``case`` in its second sequence."""
    g = _plain(100 + len(case))
    toks, masks = g["tokens"], g["masks"]
    if case == "id 49159":
        toks[1][8] = masks[1][8] = 49159
    elif case == "id 2^31-1":
        toks[1][3] = 2**31 - 1
    elif case == "label -5":
        masks[1][8] = -5
    elif case == "label 49155":
        masks[1][8] = 49155
    elif case == "all masked":
        g["masks"] = [[-100] * len(t) for t in toks]
    elif case == "score 1e308":
        g["scores"] = [1e308, -1e308, 0.0, 1.0]
    elif case == "empty":
        toks[1], masks[1] = [], []
    elif case == "one token":
        toks[1], masks[1] = toks[1][:1], masks[1][:1]
    elif case == "labels differ":
        masks[1][6:] = [t + 1 for t in toks[1][6:]]
    elif case == "500 tokens":
        toks[1] = (toks[1] * 50)[:500]
        masks[1] = [-100] * 6 + toks[1][6:]
    elif case == "negative id":
        toks[1][2] = -1
    elif case == "masks longer":
        masks[1] = masks[1] + [5]
    return g


CASES = {  # the probe's defect -> the reason the trainer gives
    "id 49159": "token_range", "id 2^31-1": "token_range", "label -5": "label_range",
    "label 49155": "label_range", "all masked": "no_trained_token", "score 1e308": "score",
    "empty": "empty", "one token": "empty", "labels differ": "label_mismatch",
    "500 tokens": "too_long", "negative id": "token_range", "masks longer": "shape",
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_probe_defect_is_found_with_its_reason(case):
    reason, detail = check_group(_poison(case), VOCAB, MAX_LEN)
    assert reason == CASES[case], detail
    assert "sequence 1" in detail or reason == "score" or case == "all masked"
    assert check_group(_plain(0), VOCAB, MAX_LEN) is None


def test_scores_and_advantages_are_bounded():
    g = _plain(0)
    g["scores"] = [MAX_ABS_SCORE, -MAX_ABS_SCORE, 0.0, 1.0]
    assert check_group(g, VOCAB, MAX_LEN) is None
    g["advantages"] = [[0.0] * 12, [2e6] * 12, [0.0] * 12, [0.0] * 12]
    assert check_group(g, VOCAB, MAX_LEN)[0] == "score"
    g = _plain(0)
    g["distill_token_ids"] = [[[]] + [[VOCAB]] * 11] * 4
    g["distill_logprobs"] = [[[]] + [[-0.1]] * 11] * 4
    assert check_group(g, VOCAB, MAX_LEN)[0] == "token_range"


def test_guard_drops_bad_groups_or_the_whole_batch_under_fsdp(capsys):
    batch = [_plain(0), {**_poison("id 49159"), "env_id": 3}, _plain(1)]
    guard = BatchGuard(VOCAB, MAX_LEN)
    assert guard.filter(7, batch) == [batch[0], batch[2]]
    line = capsys.readouterr().out.strip()
    assert line == ("[grpo] error: step 7: dropped group 2 of 3 (env 3): sequence 1 position 8 has "
                    "token id 49159, outside the model's vocabulary [0, 49152). Likely cause: a "
                    "tokenizer mismatch: the env must tokenize with the tokenizer of the trainer's --model")
    fsdp = BatchGuard(VOCAB, MAX_LEN, whole_batch=True)
    assert fsdp.filter(8, batch) == [] and fsdp.batches_skipped == 1
    assert "skipped the whole batch (FSDP trains whole batches only)" in capsys.readouterr().out
    assert guard.summary() == {"skipped_groups": {"token_range": 1}, "skipped_batches": 0}


@needs_tokenizer
def test_the_probes_bad_groups_never_crash_the_trainer_nor_reach_the_loss(tiny_model, run_api, tmp_path,  # noqa: F811
                                                                           capsys):
    """Every bad group is refused by run-api or dropped by the trainer; the good ones train."""
    posted_poison, refused = 0, []
    good = 0
    with AtroposClient(run_api.url) as client:
        for i, case in enumerate(CASES):  # one batch (of 8) per defect: the bad group + a good one
            try:
                client.post_scored_data(_poison(case))
            except ApiRejectedError as exc:
                assert 400 <= exc.status_code < 500
                refused.append(case)
                continue
            posted_poison += 1
            client.post_scored_data(_plain(i))
            good += 1
        both = []  # a batch of two bad groups: nothing to train on
        for case in ("labels differ", "all masked"):
            try:
                client.post_scored_data(_poison(case))
                both.append(case)
            except ApiRejectedError:
                client.post_scored_data(_plain(50 + len(both)))
        posted_poison += len(both)
    steps = posted_poison - len(both) + 1
    print(f"run-api refused {refused}; {posted_poison} bad groups reached the trainer")
    run = tmp_path / "run"
    summary = train(TrainerConfig(
        model=str(tiny_model), run_dir=str(run), api_url=run_api.url, vllm_url="http://127.0.0.1:9/v1",
        weight_sync="none", training_steps=steps, batch_size=8, micro_batch_size=8,
        max_token_len=MAX_LEN, batch_timeout=60, torch_threads=1))
    out = capsys.readouterr().out
    assert summary["stopped"] == "completed" and summary["steps"] == steps, out[-3000:]
    assert sum(summary["skipped_groups"].values()) == posted_poison
    assert summary["skipped_batches"] == (1 if len(both) == 2 else 0)
    dropped = re.findall(r"\[grpo\] error: step \d+: dropped group \d of 2 \(env None\): .*Likely cause: ", out)
    assert len(dropped) == posted_poison
    assert out.count("a tokenizer mismatch") >= sum(
        CASES[c] in ("token_range", "label_range", "label_mismatch") for c in CASES if c not in refused)
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "loss" in r]
    assert sum(r["sequences"] for r in trained) == 4 * (good + 2 - len(both))
    assert all(r["skipped_groups"] == 1 for r in trained[:good])
    with AtroposClient(run_api.url) as client:  # the step moved past every batch: none is fetched again
        status = client.status()
    assert status["current_step"] == steps and status["queue_size"] == 0
