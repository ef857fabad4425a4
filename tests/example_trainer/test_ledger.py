"""The trainer's summary.json ledger closes exactly, and every step logs the ledger's counts."""

import json

import pytest

from example_trainer.config import TrainerConfig
from example_trainer.ledger import TrainerLedger
from example_trainer.metrics import TrainerMetrics
from tests.example_trainer.test_grpo_loop import _group, needs_tokenizer, tiny_model, train_on  # noqa: F401, F811

#: completion tokens of a sequence of _group (12 tokens, the first 6 masked)
PER_SEQ = 6
FRACTIONS = ("infra_failed_rate", "masked_frac", "stale_token_frac", "filter_token_frac",
             "all_same_token_frac")


def _with_outcomes(group: dict, prefix: str) -> dict:
    """A group of 4 completed members (one retried once), one masked (4 trained tokens), one failed."""
    masked = {"rollout_id": f"{prefix}/m", "outcome": "masked", "reason": "format", "score": 0.0,
              "tokens": list(range(20, 30)), "masks": [-100] * 6 + list(range(26, 30))}
    failed = {"rollout_id": f"{prefix}/f", "attempt": 2, "outcome": "failed", "kind": "inference"}
    return {**group, "rollout_ids": [f"{prefix}/{i}" for i in range(4)], "attempts": [0, 1, 0, 0],
            "excluded": [masked, failed]}


@needs_tokenizer
def test_a_two_step_run_closes_the_ledger_in_summary_json(tiny_model, run_api, tmp_path) -> None:  # noqa: F811
    config = TrainerConfig(
        model=str(tiny_model), run_dir=str(tmp_path / "run"), api_url=run_api.url,
        vllm_url="http://127.0.0.1:9/v1", weight_sync="none", training_steps=2, batch_size=8,
        micro_batch_size=8, lr=1e-3, batch_timeout=60, max_staleness=0)
    drops = {"groups": 2, "completed": 8, "tokens": 30, "groups_by_reason": {"same_scores": 2},
             "tokens_by_reason": {"same_scores": 30}}
    groups = [_with_outcomes(_group(0), "a"), _group(1) | {"env_drops": drops},
              _group(2) | {"policy_version": 0},  # queued after step 1's batch: stale at step 2
              _group(3), _group(4), _group(5)]
    result, _ = train_on(config, run_api.url, groups)
    assert result["steps"] == 2
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    ledger = summary["ledger"]
    assert ledger == result["ledger"] and ledger["source"] == "run-api" and ledger["closes"] is True
    t = ledger["tokens"]
    assert t == {"sampled": 6 * 4 * PER_SEQ + 4 + 30, "trained": 16 * PER_SEQ,
                 "dropped_stale": 4 * PER_SEQ, "dropped_filter": 30, "dropped_poison": 0,
                 "dropped_masked": 4, "queued_at_end": 4 * PER_SEQ}
    assert t["sampled"] == sum(v for k, v in t.items() if k != "sampled")
    assert ledger["rollouts"] == {"sampled": 24 + 8 + 1 + 1 + 3, "completed": 24 + 8, "masked": 1,
                                  "failed": 1 + 3}
    assert ledger["waste"]["stale_token_frac"] == pytest.approx(24 / t["sampled"])
    assert ledger["waste"]["all_same_token_frac"] == pytest.approx(30 / t["sampled"])
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "loss" in x]
    assert [x["ledger/tokens_trained"] for x in steps] == [8 * PER_SEQ, 16 * PER_SEQ]
    assert all(name in x for x in steps for name in FRACTIONS)
    assert steps[-1]["stale_token_frac"] == pytest.approx(24 / t["sampled"])


def test_poison_drops_count_apart_from_trained_tokens_and_a_stock_server_has_no_ledger() -> None:
    ledger = TrainerLedger()
    good, bad = _group(0), _group(1)
    fields = ledger.step([good, bad], [good])
    assert fields == {"ledger/tokens_trained": 4 * PER_SEQ, "ledger/tokens_dropped_poison": 4 * PER_SEQ}
    ledger.step([bad], [])  # a skipped step: all of it dropped
    assert ledger.summary() == {"source": "trainer", "closes": None,
                                "tokens": {"trained": 4 * PER_SEQ, "dropped_poison": 8 * PER_SEQ}}
    # a resumed run goes on from the newest record that has the counts
    again = TrainerLedger.resumed([{"step": 1, **fields}, {"step": 2, "eval/accuracy": 0.5}])
    assert (again.trained, again.poison) == (4 * PER_SEQ, 4 * PER_SEQ)


def test_prometheus_gauges_follow_the_step_records() -> None:
    metrics = TrainerMetrics()
    metrics.observe(1, {"skipped_groups": 1, "ledger/tokens_trained": 5, "stale_token_frac": 0.25})
    assert metrics.registry.get_sample_value("atropos_trainer_ledger_tokens", {"fate": "trained"}) == 5
    assert metrics.registry.get_sample_value(
        "atropos_trainer_ledger_fraction", {"name": "stale_token_frac"}) == 0.25
