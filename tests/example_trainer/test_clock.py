"""The training clock: what --max-train-seconds counts, and how long the loop ran."""

from __future__ import annotations

import time

from example_trainer.clock import TrainClock


def test_evaluations_after_registration_are_kept_off_the_training_clock():
    clock = TrainClock()
    with clock.evaluation():  # the starting policy's evaluation: before the clock starts
        time.sleep(0.05)
    started = time.perf_counter()
    clock.start_training()
    time.sleep(0.05)
    with clock.evaluation():
        time.sleep(0.2)
    since_start = time.perf_counter() - started
    assert 0.05 <= clock.elapsed() <= since_start - 0.2  # the 0.2 s evaluation is not training
    assert clock.eval_seconds >= 0.25
    assert clock.end_training() >= 0.25  # the loop's own length, evaluations included
    time.sleep(0.02)
    assert clock.end_training() == clock.train_seconds  # fixed once
    assert clock.wall_seconds() > clock.train_seconds


def test_a_run_that_never_registered_trained_for_zero_seconds():
    clock = TrainClock(wall_start=time.perf_counter() - 3.0)
    assert clock.end_training() == 0.0
    assert clock.wall_seconds() >= 3.0
