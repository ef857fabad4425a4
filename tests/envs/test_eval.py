"""Evaluation helpers: pass@k estimator, bounded concurrency, mean metrics."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest

from atroposlib.envs.eval import evaluate_items, mean_metrics, pass_at_k


def test_pass_at_k_matches_the_combinatorial_definition():
    for n, c, k in itertools.product(range(1, 9), range(0, 9), range(1, 9)):
        if c > n or k > n:
            continue
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


async def test_evaluate_items_bounds_concurrency_and_counts_failures():
    active = peak = 0

    async def run(i):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        active -= 1
        if i == 3:
            raise ValueError("bad item")
        return {"correct": i % 2 == 0, "length": i}

    results, failed = await evaluate_items(range(10), run, max_concurrency=3)
    assert peak == 3 and failed == 1 and len(results) == 9
    metrics = mean_metrics(results)
    assert metrics["eval/correct"] == pytest.approx(5 / 9)
    assert metrics["eval/length"] == pytest.approx((45 - 3) / 9)


def test_sample_row_reads_the_usual_keys_and_chat_messages():
    from atroposlib.envs.eval import sample_row

    assert sample_row({"question": "2+2?", "reply": "4", "correct": True, "answer": 4}) == {
        "prompt": "2+2?", "completion": "4", "score": 1.0, "reference": "4"}
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}]
    assert sample_row({"messages": chat, "score": -1, "gold_answer": "hey"}) == {
        "prompt": "hi", "completion": "hello", "score": -1, "reference": "hey"}
    # Nothing recognisable: empty columns, no score; structured values become JSON.
    assert sample_row({"seed": 3, "reference": {"calls": [1]}}) == {
        "prompt": "", "completion": "", "score": None, "reference": '{"calls": [1]}'}


def test_samples_summary_counts_unscored_and_accuracy_is_score_above_zero(tmp_path):
    from atroposlib.envs.eval import samples_summary

    rows = [{"score": 1.0}, {"score": -1.0}, {"score": 1.0}, {"score": None}]
    line = samples_summary(rows, tmp_path)
    assert line.startswith("4 samples, mean score 0.3333 (1 unscored), accuracy 66.7% (score > 0)")
    assert str(tmp_path / "samples.csv") in line
    assert samples_summary([{"score": None}], tmp_path).startswith("1 sample; samples written")


def test_evaluate_log_writes_the_samples_table_beside_metrics(tmp_path, capsys):
    import csv

    from atroposlib.envs.eval import evaluate_log

    evaluate_log({"acc": 0.5}, eval_dir=tmp_path, samples=[
        {"prompt": "p,1", "completion": 'say "x"\nnow', "score": 1, "reference": "r"},
        {"prompt": "p2", "completion": "c2", "score": 0, "reference": "r2"}])
    with open(tmp_path / "samples.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows[0] == {"prompt": "p,1", "completion": 'say "x"\nnow', "score": "1",
                       "reference": "r"}
    assert len(rows) == 2 and (tmp_path / "metrics.json").exists()
    assert "2 samples, mean score 0.5, accuracy 50.0% (score > 0)" in capsys.readouterr().out
    evaluate_log({"acc": 0.5}, eval_dir=tmp_path / "none")  # no samples: no table
    assert not (tmp_path / "none" / "samples.csv").exists()
