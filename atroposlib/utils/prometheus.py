"""Prometheus conventions shared by every atroposlib process: metric names, buckets, serving.

Every metric an atroposlib part exports is named ``atropos_<part>_<what>[_<unit>]``:

* ``<part>`` is the process that exports it: ``api`` (run-api), ``trainer``, ``env``,
  ``inference`` (the inference node);
* ``<unit>`` is a base unit in the plural (``_seconds``, ``_tokens``, ``_steps``), and counters
  end in ``_total`` (``prometheus_client`` adds it to a ``Counter``'s name).

Build names with :func:`metric_name` so the prefix and the part are spelled once. run-api serves
its metrics on its own ``GET /metrics`` route; a process without an HTTP server (the trainer,
an env) calls :func:`serve_metrics` once to expose its registry on a port of its own.

Example::

    from prometheus_client import Counter
    from atroposlib.utils.prometheus import metric_name, serve_metrics

    STEPS = Counter(metric_name("trainer", "steps"), "Optimizer steps taken.")
    serve_metrics(9400)          # http://127.0.0.1:9400/metrics
    STEPS.inc()

The metric names of each part and a Grafana dashboard are documented in ``docs/metrics.md``.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client import start_http_server as _start_http_server

from atroposlib.defaults import DEFAULT_METRICS_HOST

__all__ = ["CONTENT_TYPE", "DURATION_BUCKETS_S", "PARTS", "PREFIX", "STALENESS_BUCKETS_STEPS",
           "MetricsServer", "metric_name", "render", "serve_metrics"]

#: Prefix of every metric name.
PREFIX = "atropos_"
#: The parts that export metrics (the second word of each name).
PARTS = frozenset({"api", "trainer", "env", "inference"})
#: Histogram buckets of durations, in seconds: 1 ms (an HTTP call) to 10 minutes (a slow step).
DURATION_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                      10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: Histogram buckets of staleness, in policy versions (trainer steps) behind.
STALENESS_BUCKETS_STEPS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
#: ``Content-Type`` of the text exposition format that :func:`render` writes.
CONTENT_TYPE = CONTENT_TYPE_LATEST

_NAME = re.compile(r"[a-z][a-z0-9_]*")


def metric_name(part: str, name: str) -> str:
    """Return ``atropos_<part>_<name>``, the full name of one metric.

    Args:
        part: the exporting process, one of :data:`PARTS`.
        name: the rest, lower-case words joined by ``_``, ending in the unit when it has one
            (``queue_tokens``, ``request_duration_seconds``); counters without ``_total``.

    Raises:
        ValueError: an unknown part, or a name that is not lower-case snake case.
    """
    if part not in PARTS:
        raise ValueError(f"unknown metrics part {part!r}: use one of {sorted(PARTS)} (or add the "
                         "new part to atroposlib.utils.prometheus.PARTS)")
    if not _NAME.fullmatch(name) or name.endswith("_total"):
        raise ValueError(f"metric name {name!r}: use lower-case snake case without '_total' "
                         "(prometheus_client adds it to counters)")
    return f"{PREFIX}{part}_{name}"


def render(registry: CollectorRegistry = REGISTRY) -> bytes:
    """The registry's metrics in the Prometheus text format (serve with :data:`CONTENT_TYPE`)."""
    return generate_latest(registry)


@dataclass
class MetricsServer:
    """A running metrics endpoint (from :func:`serve_metrics`).

    Attributes:
        url: where to scrape, e.g. ``http://127.0.0.1:9400/metrics``.
        server: the WSGI server (daemon thread).
        thread: the thread serving it.
    """

    url: str
    server: WSGIServer
    thread: threading.Thread

    def close(self) -> None:
        """Stop serving and free the port."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def serve_metrics(port: int, host: str = DEFAULT_METRICS_HOST,
                  registry: CollectorRegistry = REGISTRY) -> MetricsServer:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread.

    For processes without an HTTP server of their own (the trainer, an env). The endpoint has
    no authentication, so it binds 127.0.0.1 by default; pass ``host="0.0.0.0"`` only on a
    network where anyone may read the metrics.

    Args:
        port: TCP port (0 picks a free one; the URL then names the chosen port).
        host: interface to bind.
        registry: the metrics to serve (default: prometheus_client's global registry).

    Returns:
        The running server; :meth:`MetricsServer.close` stops it.

    Raises:
        OSError: the port is taken.
    """
    server, thread = _start_http_server(port, addr=host, registry=registry)
    bound = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    return MetricsServer(f"http://{shown}:{bound}/metrics", server, thread)
