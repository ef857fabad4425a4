"""``AsyncSemWithAdaptiveWeight``: a FIFO semaphore whose usable size follows the env's weight."""

from __future__ import annotations

import asyncio
from collections import deque


class AsyncSemWithAdaptiveWeight:
    """A FIFO async semaphore whose effective size is ``max_val * weight``.

    Waiters are admitted only while ``value > max_val * (1 - weight)``, so an env whose API
    ``env_weight`` is 0.25 uses about a quarter of the server's slots. Use it as
    ``async with sem: ...``.
    """

    def __init__(self, value: int = 1):
        if value < 1:
            raise ValueError(f"semaphore size must be >= 1, got {value}")
        self._value = value
        self.max_val = value
        self.weight = 1.0
        self._waiters: deque[asyncio.Future] = deque()

    @property
    def min_val(self) -> float:
        """Slots held back by the weight: ``max_val * (1 - weight)``."""
        return self.max_val * (1.0 - self.weight)

    @property
    def value(self) -> int:
        """Free slots ignoring the weight (``max_val`` minus holders)."""
        return self._value

    def update_weight(self, weight: float) -> None:
        """Set the weight (clamped to [0.01, 1]) and admit waiters that may now proceed."""
        self.weight = min(1.0, max(0.01, float(weight)))
        self._wake()

    def free_slots(self) -> float:
        """Slots usable now under the current weight (may be fractional or <= 0)."""
        return self._value - self.min_val

    def locked(self) -> bool:
        """True when an ``acquire`` would wait."""
        return not (self._value > self.min_val and self._value > 0)

    async def acquire(self) -> bool:
        """Take one slot, waiting (FIFO) while the semaphore is locked."""
        if not self._waiters and not self.locked():
            self._value -= 1
            return True
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted, then cancelled before use: give the slot back
            else:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            raise
        return True

    def release(self) -> None:
        """Give one slot back and admit the next waiter if the weight allows."""
        self._value += 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and not self.locked():
            fut = self._waiters.popleft()
            if fut.done():
                continue
            self._value -= 1
            fut.set_result(True)

    async def __aenter__(self) -> AsyncSemWithAdaptiveWeight:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


__all__ = ["AsyncSemWithAdaptiveWeight"]
