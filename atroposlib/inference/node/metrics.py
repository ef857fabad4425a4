"""The inference node's Prometheus metrics (``GET /atropos/metrics``), read from its state at scrape time.

Names follow :mod:`atroposlib.utils.prometheus` (``atropos_inference_*``); vLLM's own metrics
(throughput, KV cache, queue) stay at vLLM's ``GET /metrics``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from atroposlib.inference.node.models import ServingState
from atroposlib.utils.prometheus import LiveCollector, render


class NodeCollector(LiveCollector):
    """Yields one node's metrics (``source``: its :class:`~atroposlib.inference.node.state.NodeState`)."""

    part = "inference"

    def collect(self) -> Iterator[Metric]:
        """The metrics now."""
        state = self.source
        _name = self.name
        yield GaugeMetricFamily(_name("policy_version"), "Policy version (trainer step) served; -1: "
                                "none yet.", value=-1 if state.version is None else state.version)
        serving = GaugeMetricFamily(_name("state"), "1 for the node's current state.", labels=["state"])
        for name in get_args(ServingState):
            serving.add_metric([name], float(state.state == name))
        yield serving
        yield GaugeMetricFamily(_name("completions_in_flight"), "Completions being served now.",
                                value=state.in_flight)
        updates = CounterMetricFamily(_name("weight_updates"), "Weight updates by outcome.",
                                      labels=["outcome"])
        for outcome in ("applied", "failed"):
            updates.add_metric([outcome], state.updates[outcome])
        yield updates
        yield CounterMetricFamily(_name("weight_bytes_received"), "Bytes of applied weight pushes.",
                                  value=state.bytes_received)
        last = state.last_update
        if last is not None:
            for field, help_text in (("receive_seconds", "receiving and checking"),
                                     ("drain_seconds", "waiting for completions in flight"),
                                     ("apply_seconds", "loading into vLLM")):
                yield GaugeMetricFamily(_name(f"last_update_{field}"),
                                        f"Seconds the last update spent {help_text}.",
                                        value=getattr(last, field))


def render_node_metrics(state: Any) -> bytes:
    """The node's metrics in the Prometheus text format."""
    return render(NodeCollector(state).registry())


__all__ = ["NodeCollector", "render_node_metrics"]
