"""The trainer's progress text: step N/M, the budget used, the ETA, and what a wait waits for."""

import math

import pytest

from example_trainer.progress import duration, progress_text, waiting_text


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (44.6, "45s"), (60, "1m00s"), (185, "3m05s"), (3599, "59m59s"), (3720, "1h02m"),
    (None, "?"), (math.inf, "?"), (-3, "0s"),
])
def test_duration(seconds, text):
    assert duration(seconds) == text


def test_step_count_without_a_budget_gives_the_time_so_far_and_the_eta():
    # 12 steps in 180 s: 15 s a step, 388 steps left
    assert progress_text(12, 400, 180.0) == "step 12/400 (3m00s, ETA 1h37m)"
    assert progress_text(400, 400, 6000.0) == "step 400/400 (1h40m, ETA 0s)"


def test_a_budget_that_ends_the_run_first_sets_the_expected_last_step_and_the_eta():
    # 15 s a step, 660 s of 840 left: 44 more steps, well before step 400
    assert progress_text(12, 400, 180.0, budget=840) == "step 12/~56 (budget 3m00s/14m00s, 21%, ETA 11m00s)"
    # a budget the steps end first: M stays --training-steps, the ETA is the steps'
    assert progress_text(12, 20, 180.0, budget=840) == "step 12/20 (budget 3m00s/14m00s, 21%, ETA 2m00s)"
    # the budget used up (the last step overran it a little)
    assert progress_text(57, 400, 850.0, budget=840) == "step 57/~57 (budget 14m10s/14m00s, 100%, ETA 0s)"


def test_a_resumed_run_counts_its_rate_from_its_own_steps():
    # resumed after step 100: 10 steps in 100 s
    assert progress_text(110, 200, 100.0, start_step=100) == "step 110/200 (1m40s, ETA 15m00s)"
    # no time measured yet: no rate, no ETA
    assert progress_text(1, 20, 0.0) == "step 1/20 (0s, ETA ?)"
    assert progress_text(20, 20, 0.0) == "step 20/20 (0s, ETA 0s)"  # the last step needs no rate


def test_waiting_text_says_what_the_run_waits_for():
    assert waiting_text({"current_step": 0, "queue_size": 0}, 0.0, True, 16) == (
        "waiting for the first batch (16 sequences): run-api has 0 groups queued, 0s so far; "
        "the environments send groups once they are up")
    assert waiting_text({"current_step": 3, "queue_size": 1}, 31.0, False) == (
        "waiting for the next batch: run-api has 1 group queued, 31s so far")
    assert waiting_text(None, 60.0, False, 8) == (
        "waiting for the next batch (8 sequences): run-api did not answer GET /status, 1m00s so far")
