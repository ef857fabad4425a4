"""Request metrics of an inference client: bounded timings and attempt counts per split, for W&B."""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any


class _SplitMetrics:
    """Bounded request timings and attempt counts for one split (train or eval)."""

    def __init__(self, maxlen: int):
        self.timings: deque[float] = deque(maxlen=maxlen)
        self.attempts: deque[int] = deque(maxlen=maxlen)
        self.failures = 0


def _recent(split: str, field: str, doc: str) -> property:
    """A read-only attribute that is ``_metrics[split].<field>`` (a bounded ``deque``)."""
    return property(lambda self: getattr(self._metrics[split], field), doc=doc)


class RequestMetrics:
    """Timings, attempts and failures of recent requests (a mixin of ``InferenceClient``).

    One bounded record per split (``train``, ``eval``) of the last ``rolling_buffer_length``
    requests; :meth:`wandb_metrics` summarises them, and Atropos 0.4's attribute names
    (``request_timings``, ``attempts_list`` ...) read them.
    :meth:`_init_request_metrics` sets them up (``InferenceClient.__init__`` calls it).
    """

    name: str

    def _init_request_metrics(self, maxlen: int) -> None:
        """Empty records of at most ``maxlen`` requests per split."""
        self._metrics = {"train": _SplitMetrics(maxlen), "eval": _SplitMetrics(maxlen)}

    def wandb_metrics(
        self, metrics_dict: dict[str, Any] | None = None, server_name: str | None = None
    ) -> dict[str, Any]:
        """Add this server's request metrics to ``metrics_dict`` and return it.

        Keys: ``server/{name}_request_time_avg|std|99p``, ``server/{name}_eval_request_time_*``,
        ``server/{name}_average_num_attempts``, ``server/{name}_eval_retry_rate`` and
        ``server/{name}_failed_requests`` (seconds for times).
        """
        metrics_dict = {} if metrics_dict is None else metrics_dict
        name = server_name or self.name
        for split, prefix in (("train", ""), ("eval", "eval_")):
            m = self._metrics[split]
            if m.timings:
                timings = sorted(m.timings)
                metrics_dict[f"server/{name}_{prefix}request_time_avg"] = statistics.fmean(timings)
                metrics_dict[f"server/{name}_{prefix}request_time_std"] = statistics.pstdev(timings)
                metrics_dict[f"server/{name}_{prefix}request_time_99p"] = timings[
                    min(len(timings) - 1, int(0.99 * len(timings)))
                ]
            if m.attempts:
                if split == "train":
                    metrics_dict[f"server/{name}_average_num_attempts"] = statistics.fmean(
                        m.attempts
                    )
                else:
                    metrics_dict[f"server/{name}_eval_retry_rate"] = sum(
                        1 for a in m.attempts if a > 1
                    ) / len(m.attempts)
            metrics_dict[f"server/{name}_{prefix}failed_requests"] = m.failures
        return metrics_dict

    # Upstream Atropos exposes the per-request metrics as these attributes; ours are bounded
    # to the last ``rolling_buffer_length`` requests.
    request_timings = _recent("train", "timings", "Seconds of recent train-split requests.")
    attempts_list = _recent("train", "attempts", "Attempts of recent train-split requests.")
    eval_request_timings = _recent("eval", "timings", "Seconds of recent eval-split requests.")
    eval_attempts_list = _recent("eval", "attempts", "Attempts of recent eval-split requests.")

__all__ = ["RequestMetrics"]
