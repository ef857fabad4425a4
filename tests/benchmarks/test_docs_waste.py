"""The waste block of docs/benchmarks.md: sampled tokens wasted without and with the screen."""

from __future__ import annotations

import pytest

from benchmarks.docs_outcomes import WASTE, waste_table


def _payload(stale: float, same: float, steps: int, difficulty: str = "2", minutes: float = 7.0) -> dict:
    ledger = {"waste": {"stale_token_frac": stale, "filter_token_frac": same, "all_same_token_frac": same}}
    return {"runs": [{"steps": steps, "ledger": ledger, "budget_minutes": minutes,
                      "env_args": {"env.difficulty": difficulty},
                      "groups": {"final": {"dropped_same_scores": int(100 * same), "sampled": 100}},
                      "curve": [{"minute": 0.0, "accuracy": 0.3}, {"minute": 3.5, "accuracy": 0.5},
                                {"minute": 7.0, "accuracy": 0.6}]}]}


def test_each_arm_gets_its_waste_and_each_pair_the_ratio_against_the_goal():
    text = waste_table(_payload(0.0, 0.6, 60), _payload(0.0, 0.2, 40),
                       _payload(0.1, 0.7, 50, "4", 14.0), _payload(0.1, 0.5, 30, "4", 14.0))
    assert "| difficulty 2, 7 min | no screen | 60.0% | 0.0% | 60.0% | 60 / 100 | 60 | 3.5 min 0.500  7 min 0.600 |" in text
    assert ("| difficulty 4, 14 min | best of 8 by the answer's probability | 60.0% | 10.0% | 50.0% | 50 / 100 | 30 |"
            in text)
    # waste = stale + filtered: 0.2 / 0.6 in the first pair, 0.6 / 0.8 in the second
    assert "difficulty 2, 7 min: 0.33x; difficulty 4, 14 min: 0.75x" in text
    assert all(f"benchmarks/results/{name}" in text for name in WASTE[:4])
    assert WASTE[4] not in text  # only the files of the pairs given


def test_an_unpaired_result_is_refused():
    with pytest.raises(ValueError):
        waste_table(_payload(0.0, 0.6, 60), _payload(0.0, 0.2, 40), _payload(0.0, 0.6, 60))


def test_a_task_run_in_two_pairs_numbers_them_and_gives_each_arms_mean_accuracy():
    first_off, first_on = _payload(0.0, 0.6, 60, "4"), _payload(0.0, 0.3, 60, "4")
    second_off, second_on = _payload(0.0, 0.5, 60, "4"), _payload(0.0, 0.2, 60, "4")
    second_off["runs"][0]["curve"][-1]["accuracy"] = 0.4  # finals: 0.6 and 0.4 without, 0.6 and 0.6 with
    text = waste_table(_payload(0.0, 0.6, 60), _payload(0.0, 0.2, 40), first_off, first_on, second_off, second_on)
    assert "| difficulty 4, 7 min, pair 1 | no screen | 60.0% |" in text
    assert "| difficulty 4, 7 min, pair 2 | best of 8 by the answer's probability | 20.0% |" in text
    assert "difficulty 4, 7 min, pair 1: 0.50x; difficulty 4, 7 min, pair 2: 0.40x." in text
    assert ("Mean held-out accuracy at the end, difficulty 4, 7 min: 0.500 without, 0.600 with "
            "(n = 2 per arm).") in text
    assert "| difficulty 2, 7 min | no screen |" in text  # a task run once keeps its plain name
