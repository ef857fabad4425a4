"""Background weight pushes: one in flight, its metrics or its error handed back."""

from __future__ import annotations

import threading

import pytest

from atroposlib.errors import InferenceError
from atroposlib.inference.weights.background import BackgroundPush
from atroposlib.inference.weights.base import WeightTarget


class _Target(WeightTarget):
    """Records pushes; fails the versions listed in ``fail``; holds each push until released."""

    def __init__(self, fail: tuple[int, ...] = ()):
        self.fail, self.pushed, self.release = fail, [], threading.Event()

    def push(self, tensors, version, metadata=None):
        self.release.wait(5)
        if version in self.fail:
            raise InferenceError(f"version {version} refused")
        self.pushed.append((threading.current_thread().name, version, metadata))
        return {"sync/update_seconds": float(version)}


def test_a_push_runs_in_the_worker_thread_and_wait_returns_its_metrics():
    background, target = BackgroundPush(), _Target()
    assert background.wait() == {}  # nothing in flight
    background.submit(target, {"w": 1}, 3, {"k": "v"})
    assert target.pushed == []  # still held: the caller went on
    target.release.set()
    assert background.wait() == {"sync/update_seconds": 3.0} and background.pending is None
    assert target.pushed[0][0].startswith("vllm-sync") and target.pushed[0][1:] == (3, {"k": "v"})
    assert background.close() is None


def test_a_failed_push_raises_at_wait_and_is_handed_back_by_close():
    background, target = BackgroundPush(), _Target(fail=(1, 2))
    target.release.set()
    background.submit(target, {}, 1)
    with pytest.raises(InferenceError, match="version 1 refused"):
        background.wait()
    background.submit(target, {}, 2)
    error = background.close()  # shutting down: the error comes back instead of being raised
    assert isinstance(error, InferenceError) and "version 2" in str(error)
    assert background.pending is None and background._executor is None
