"""Weight pushes in a background thread, one at a time: training goes on while servers load weights.

A trainer that pushes in the background lets its next step run while the servers take this
step's weights; their policy then lags the trainer by at most one push. The caller copies what
training will change before handing it over (a push reads its tensors until it returns).
"""

from __future__ import annotations

from typing import Any

from atroposlib.inference.weights.base import WeightTarget


class BackgroundPush:
    """At most one :meth:`WeightTarget.push <atroposlib.inference.weights.base.WeightTarget.push>` in flight, in one worker thread.

    Attributes:
        pending: the push in flight (a ``concurrent.futures.Future`` of its metrics), or None.
    """

    def __init__(self) -> None:
        """No thread yet: the first :meth:`submit` starts it."""
        self.pending: Any = None
        self._executor: Any = None

    def submit(self, target: WeightTarget, tensors: dict[str, Any], version: int,
               metadata: dict[str, str] | None = None) -> None:
        """Start ``target.push(tensors, version, metadata)`` in the worker thread.

        Call :meth:`wait` first when a push may be in flight: a push submitted while another
        runs queues behind it, and only the newest one's result is kept.
        """
        from concurrent.futures import ThreadPoolExecutor

        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="vllm-sync")
        self.pending = self._executor.submit(target.push, tensors, version, metadata)

    def wait(self) -> dict[str, float]:
        """Wait for the push in flight, if any; return its metrics (``{}`` if none).

        Raises:
            InferenceError: that push failed (the server refused the update or died).
        """
        pending, self.pending = self.pending, None
        return pending.result() if pending is not None else {}

    def close(self) -> BaseException | None:
        """Wait for the push in flight and stop the thread; it takes no push after.

        Returns:
            The error that push raised (for the caller to report, not raise, while shutting
            down), or None.
        """
        error = None
        if self.pending is not None:
            try:
                self.wait()
            except Exception as exc:  # noqa: BLE001 - shutting down: handed back, not raised
                error = exc
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        return error


__all__ = ["BackgroundPush"]
