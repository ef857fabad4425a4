"""Serve mode's Prometheus metrics (``--env.metrics_port``): rollouts in flight, groups sent and dropped.

Read live from the :class:`~atroposlib.env_runtime.serve.ServeLoop` at each scrape (a custom
collector: nothing is counted twice), from the env's ``stats`` counters that the serve loop and
:func:`~atroposlib.env_runtime.step.run_item` keep. Names follow
:mod:`atroposlib.utils.prometheus` (``atropos_env_*``); ``docs/metrics.md`` lists them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from atroposlib.env_runtime.pace import seconds_text
from atroposlib.env_runtime.step import Skip
from atroposlib.utils.prometheus import LiveCollector, MetricsServer, serve_metrics

#: ``env.stats`` keys of groups dropped on the way to run-api -> the ``reason`` label.
_DROPPED = {
    **{f"groups_dropped_{r.value}": r.value for r in Skip if r is not Skip.INFERENCE},
    "groups_rejected_by_api": "rejected_by_api",
    "groups_unsendable": "unsendable",
    "groups_unsent_at_shutdown": "unsent_at_shutdown",
}
#: Failure kinds and mask reasons of excluded group members (``members_<outcome>_<kind>`` keys).
_EXCLUDED = [("failed", k) for k in ("inference", "timeout", "env_error", "sandbox")] + [
    ("masked", r) for r in ("truncated", "format", "env")]

#: ``ServeLoop.pace_report`` keys -> gauge name and help (absent while unknown).
_PACE = [
    ("offpolicy_window_batches", "offpolicy_window_batches", "Batches ahead of the trainer the env "
     "may sample: max_batches_offpolicy narrowed to run-api's max_staleness."),
    ("rollout_latency_s", "rollout_latency_seconds", "Smoothed seconds from a rollout's start to "
     "its finished group."),
    ("step_interval_s", "trainer_step_interval_seconds", "Smoothed seconds between the trainer "
     "steps the env sees."),
]


class ServeLoopCollector(LiveCollector):
    """Yields one serve loop's metrics (``source``: the :class:`~atroposlib.env_runtime.serve.ServeLoop`)."""

    part = "env"

    def collect(self) -> Iterator[Metric]:
        """The metrics, read from the loop and the env's counters now."""
        loop = self.source
        _name = self.name
        stats = loop.env.stats
        outbox = loop.outbox
        yield GaugeMetricFamily(_name("rollouts_in_flight"), "Rollouts (one group each) running now.",
                                value=len(loop.workers))
        yield GaugeMetricFamily(_name("unsent_groups"), "Finished groups waiting in the local outbox.",
                                value=outbox.queue.qsize() + (outbox.sending is not None))
        yield GaugeMetricFamily(_name("backlog_items"), "Items re-queued for another rollout.",
                                value=len(loop.backlog))
        yield GaugeMetricFamily(_name("trainer_step"), "The trainer step run-api last reported.",
                                value=loop.state.curr_step)
        yield GaugeMetricFamily(_name("paused"), "1 while new rollouts wait (inference outage, "
                                "failing rollouts, config drops).", value=float(loop.pacer.paused()))
        pace = loop.pace_report()
        yield GaugeMetricFamily(_name("rollout_cap"), "Rollouts allowed in flight now "
                                "(max_num_workers or the demand estimate, within the off-policy "
                                "window).",
                                value=pace["rollout_cap"])
        for key, metric, doc in _PACE:
            if key in pace:  # left out while unknown
                yield GaugeMetricFamily(_name(metric), doc, value=pace[key])
        yield CounterMetricFamily(_name("groups_sent"), "Groups run-api accepted.",
                                  value=stats["groups_sent"])
        dropped = CounterMetricFamily(_name("groups_dropped"), "Groups that never reached run-api, "
                                      "by reason.", labels=["reason"])
        for key, reason in _DROPPED.items():
            dropped.add_metric([reason], stats[key])
        yield dropped
        yield CounterMetricFamily(_name("rollouts_failed_inference"), "Rollouts whose inference "
                                  "failed (their items are retried).",
                                  value=stats["rollouts_failed_inference"])
        yield CounterMetricFamily(_name("rollouts_timed_out"), "Rollouts cancelled after "
                                  "worker_timeout (their items are retried).",
                                  value=stats["rollouts_timed_out"])
        yield CounterMetricFamily(_name("send_retries"), "Retried posts to run-api.",
                                  value=stats["send_retries"])
        excluded = CounterMetricFamily(_name("members_excluded"), "Group members sent in a "
                                       "group's excluded list (never trained on), by outcome "
                                       "and failure kind or mask reason.",
                                       labels=["outcome", "kind"])
        for outcome, kind in _EXCLUDED:
            excluded.add_metric([outcome, kind], stats[f"members_{outcome}_{kind}"])
        yield excluded


def serve_loop_metrics(loop: Any, port: int, host: str) -> MetricsServer:
    """Serve ``loop``'s metrics at ``http://host:port/metrics`` (its own registry).

    Raises:
        OSError: the port is taken.
    """
    return serve_metrics(port, host, ServeLoopCollector(loop).registry())



def progress_line(loop: Any) -> str:
    """The serve loop's periodic one-line summary.

    Step, rollout groups in flight, unsent groups, backlog, run-api's queue, the rollout cap,
    the off-policy window, the smoothed rollout latency and trainer step interval, and the
    env's counters.
    """
    pace = loop.pace_report()
    window = pace.get("offpolicy_window_batches")
    return (f"step {loop.env.curr_step}: {len(loop.workers)} rollout group(s) in flight, "
            f"{loop.outbox.queue.qsize()} unsent, backlog {len(loop.backlog)}, API queue "
            f"{loop.status.get('queue_size', '?')}; cap {pace['rollout_cap']:.0f}, window "
            f"{'none' if window is None else int(window)} batch(es), rollout "
            f"~{seconds_text(loop.pace.latency)} s, trainer step ~{seconds_text(loop.pace.step_interval)} s; "
            f"{dict(loop.env.stats)}")

__all__ = ["ServeLoopCollector", "progress_line", "serve_loop_metrics"]
