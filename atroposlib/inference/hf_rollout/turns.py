"""Sampling and training take turns on one set of weights; training goes first."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Turns:
    """A mutex between the training step and sampling, in which a waiting training step goes first.

    One generation runs at a time (two would share the same cores), never while the optimizer
    changes the weights: a rollout is sampled from exactly one policy version. While a training
    step waits, no new generation starts, so a stream of rollout requests cannot starve the
    trainer.
    """

    def __init__(self) -> None:
        """An idle lock."""
        self._cond = threading.Condition()
        self._busy = False
        self._training_waiting = 0

    @contextmanager
    def training(self) -> Iterator[None]:
        """Hold the weights for a training step (waits for the generation in progress, if any)."""
        with self._cond:
            self._training_waiting += 1
            try:
                while self._busy:
                    self._cond.wait()
            finally:
                self._training_waiting -= 1
            self._busy = True
        try:
            yield
        finally:
            self._release()

    @contextmanager
    def sampling(self) -> Iterator[None]:
        """Hold the weights for one generation (waits while a step trains or waits to)."""
        with self._cond:
            while self._busy or self._training_waiting:
                self._cond.wait()
            self._busy = True
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()


__all__ = ["Turns"]
