"""run-api's Prometheus metrics: queue depth, groups accepted and refused, batches, staleness, latency.

One :class:`ApiMetrics` per app, with its own registry (several apps in one process, as in the
tests, never share counters). Counters move where things happen (the data routes, batching);
queue gauges are read from the state at scrape time. ``GET /metrics`` serves them (see
:mod:`atroposlib.api.routes.metrics`); names follow :mod:`atroposlib.utils.prometheus` and are
listed in ``docs/metrics.md``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from atroposlib.api.store import GroupMeta
from atroposlib.utils.prometheus import (
    DURATION_BUCKETS_S,
    STALENESS_BUCKETS_STEPS,
    LiveCollector,
    metric_name,
    render,
)

if TYPE_CHECKING:
    from atroposlib.api.models import ScoredData

#: HTTP methods that get their own label value (anything else is counted as "other").
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


def _name(name: str) -> str:
    return metric_name("api", name)


class _QueueCollector(LiveCollector):
    """Gauges read from the state when scraped (``source``: the ``StateCore`` that owns this)."""

    part = "api"

    def collect(self) -> Iterator[Metric]:
        core = self.source
        now = time.monotonic()
        yield GaugeMetricFamily(_name("queue_groups"), "Groups queued for the trainer (full "
                                "groups, not yet served).", value=len(core.queue))
        yield GaugeMetricFamily(_name("queue_tokens"), "Tokens of the queued groups.",
                                value=core.queued_tokens)
        yield GaugeMetricFamily(_name("buffered_groups"), "Partial groups waiting to be merged "
                                "into a full group.", value=core.buffered_groups)
        yield GaugeMetricFamily(_name("buffered_tokens"), "Tokens of the partial groups.",
                                value=core.buffered_tokens)
        yield GaugeMetricFamily(_name("step"), "The server's step: the step of the last served "
                                "batch (the trainer's policy version).", value=core.step)
        yield GaugeMetricFamily(_name("replay_batches"), "Served batches kept for GET "
                                "/batch?step=N.", value=len(core.batches))
        yield GaugeMetricFamily(_name("envs_active"), "Registered envs that are connected and "
                                "were heard from within the heartbeat timeout.",
                                value=sum(core.is_active(e, now) for e in core.envs))
        versions = [g.policy_version for g in core.queue.values() if g.policy_version is not None]
        yield GaugeMetricFamily(_name("queue_max_staleness_steps"), "Policy versions the oldest "
                                "queued group is behind the step (0 without policy versions).",
                                value=max((core.step - v for v in versions), default=0))
        yield from _ledger_families(core.ledger_view())


def _ledger_families(ledger: dict[str, Any]) -> Iterator[Metric]:
    """The run ledger's counts (read from the journal's totals, so they survive a restart with --db)."""
    rollouts = CounterMetricFamily(_name("ledger_rollouts"), "Rollouts sampled, by outcome "
                                   "(completed, masked, failed; every attempt counts).",
                                   labels=["outcome"])
    for outcome in ("completed", "masked", "failed"):
        rollouts.add_metric([outcome], ledger["rollouts"][outcome])
    yield rollouts
    tokens = CounterMetricFamily(_name("ledger_tokens"), "Completion tokens by fate: sampled, "
                                 "served, dropped_stale, dropped_filter, dropped_masked.",
                                 labels=["fate"])
    for fate in ("sampled", "served", "dropped_stale", "dropped_filter", "dropped_masked"):
        tokens.add_metric([fate], ledger["tokens"][fate])
    yield tokens
    yield GaugeMetricFamily(_name("ledger_queued_tokens"), "Completion tokens queued or "
                            "buffered now (the ledger's fate 'queued').",
                            value=ledger["tokens"]["queued"])


class ApiMetrics:
    """The metrics of one run-api app and the registry that holds them.

    Attributes:
        registry: the app's own :class:`~prometheus_client.CollectorRegistry`.
    """

    def __init__(self, core: Any):  # an atroposlib.api.core.StateCore (which owns this)
        """Create the counters and register the state's gauges (read from ``core`` at scrape)."""
        self.registry = CollectorRegistry()
        self.accepted = Counter(_name("groups_accepted"), "Scored groups accepted (queued or "
                                "buffered), by env.", ["env"], registry=self.registry)
        self.refused = Counter(_name("groups_refused"), "Scored groups refused, by reason (the "
                               "reason of the whole request; 'malformed' counts requests whose "
                               "body failed the wire model).", ["reason"], registry=self.registry)
        self.dropped_stale = Counter(_name("groups_dropped_stale"), "Queued groups dropped as "
                                     "more than max_staleness policy versions behind.",
                                     registry=self.registry)
        self.batches = Counter(_name("batches_served"), "Batches served; replayed='true' for a "
                               "batch answered again (GET /batch?step=N).", ["replayed"],
                               registry=self.registry)
        self.served_tokens = Counter(_name("served_tokens"), "Tokens of newly served batches.",
                                     registry=self.registry)
        self.staleness = Histogram(_name("served_staleness_steps"), "Policy versions a served "
                                   "group is behind the step it is served at (groups with a "
                                   "policy_version only).", buckets=STALENESS_BUCKETS_STEPS,
                                   registry=self.registry)
        self.latency = Histogram(_name("request_duration_seconds"), "Time to answer an HTTP "
                                 "request, by method, route and status.",
                                 ["method", "route", "status"], buckets=DURATION_BUCKETS_S,
                                 registry=self.registry)
        self.registry.register(_QueueCollector(core))

    def count_accepted(self, groups: Iterable[ScoredData], envs: list[Any]) -> None:  # core.EnvRecord rows
        """Count accepted groups by the name of their env (``none`` without an env_id)."""
        for g in groups:
            self.accepted.labels(envs[g.env_id].real_name if g.env_id is not None else "none").inc()

    def served(self, step: int, groups: Iterable[GroupMeta]) -> None:
        """Count a newly served batch of ``groups`` at ``step`` (and their staleness)."""
        self.batches.labels("false").inc()
        tokens = 0
        for g in groups:
            tokens += g.n_tokens
            if g.policy_version is not None:
                self.staleness.observe(step - g.policy_version)
        self.served_tokens.inc(tokens)

    def render(self) -> bytes:
        """The metrics in the Prometheus text format."""
        return render(self.registry)


class RequestTimer:
    """ASGI middleware: observe each HTTP request's duration in ``latency``.

    ``route`` is the request path when it is one of ``routes`` (the app's paths, none of which
    has parameters), else ``"other"``, so unknown paths cannot grow the label set.
    """

    def __init__(self, app: ASGIApp, latency: Histogram, routes: Iterable[str]):
        self.app = app
        self.latency = latency
        self.routes = frozenset(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Time the request from its arrival to the end of the app's answer."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # an app that fails before answering

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            path = scope["path"]
            method = scope["method"] if scope["method"] in METHODS else "other"
            self.latency.labels(method, path if path in self.routes else "other",
                                str(status)).observe(time.perf_counter() - start)
