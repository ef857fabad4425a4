"""Prometheus metrics of the trainer, served on ``--metrics-port`` (off by default).

Every name starts with ``atropos_trainer_``; ``docs/metrics-trainer.md`` lists them with their
labels and units. The values come from the same per-step record that goes to ``metrics.jsonl``
(:meth:`TrainerMetrics.observe` is a :class:`~example_trainer.report.RunLog` observer), plus
the batch checks (groups dropped by reason), checkpoint saves and the vLLM health watch.
Only rank 0 serves them under FSDP.
"""

from __future__ import annotations

from typing import Any

#: Prefix of every trainer metric.
PREFIX = "atropos_trainer"
#: Histogram buckets for step phases, in seconds (CPU steps take seconds to a minute).
SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class TrainerMetrics:
    """The trainer's Prometheus metrics in their own registry, optionally served over HTTP.

    Args:
        port: TCP port of the ``/metrics`` endpoint (0: a free one, see :attr:`port`); None
            serves nothing (the metrics are still recorded, e.g. for tests).
        host: interface to bind (keep 127.0.0.1 unless a scraper on another machine needs it).

    Attributes:
        registry: the ``prometheus_client.CollectorRegistry`` holding every metric.
        port: the port actually bound (None when not serving).
    """

    def __init__(self, port: int | None = None, host: str = "127.0.0.1"):
        """Create the metrics and, with a port, start the HTTP server thread."""
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.step = Gauge(f"{PREFIX}_step", "Last finished trainer step (the policy version the "
                          "trainer holds).", registry=r)
        self.vllm_policy_version = Gauge(
            f"{PREFIX}_vllm_policy_version", "Trainer step whose weights vLLM received last.",
            registry=r)
        self.steps = Counter(f"{PREFIX}_steps", "Steps finished, by outcome: trained, or skipped "
                             "(every group of the batch was dropped).", ["outcome"], registry=r)
        self.batch_wait = Histogram(f"{PREFIX}_batch_wait_seconds", "Time waiting for GET /batch "
                                    "per step.", buckets=SECONDS_BUCKETS, registry=r)
        self.compute = Histogram(f"{PREFIX}_compute_seconds", "Forward, backward and optimizer "
                                 "time per step.", buckets=SECONDS_BUCKETS, registry=r)
        self.sync = Histogram(f"{PREFIX}_sync_seconds", "Weight sync time per sync (save + "
                              "update of vLLM).", buckets=SECONDS_BUCKETS, registry=r)
        self.checkpoint = Histogram(f"{PREFIX}_checkpoint_seconds", "Time to write one "
                                    "checkpoint.", buckets=SECONDS_BUCKETS, registry=r)
        self.tokens_per_second = Gauge(f"{PREFIX}_tokens_per_second", "Attended tokens per "
                                       "second of compute in the last step.", registry=r)
        self.trained_tokens = Counter(f"{PREFIX}_trained_tokens", "Tokens that carried a loss.",
                                      registry=r)
        self.loss = Gauge(f"{PREFIX}_loss", "Loss of the last trained step.", registry=r)
        self.reward = Gauge(f"{PREFIX}_reward_mean", "Mean score of the sequences of the last "
                            "trained step.", registry=r)
        self.groups_dropped = Counter(f"{PREFIX}_groups_dropped", "Groups dropped by the batch "
                                      "checks before the forward pass, by reason.", ["reason"],
                                      registry=r)
        self.batches_skipped = Counter(f"{PREFIX}_batches_skipped", "Batches of which no group "
                                       "was left to train on.", registry=r)
        self.batches_replayed = Counter(f"{PREFIX}_batches_replayed", "Batches fetched again "
                                        "from run-api after --resume (served before the "
                                        "checkpoint's step was saved).", registry=r)
        self.batches_lost = Counter(f"{PREFIX}_batches_lost", "Batches served after the "
                                    "checkpoint that run-api no longer kept at --resume.",
                                    registry=r)
        self.ledger_fraction = Gauge(f"{PREFIX}_ledger_fraction", "Run ledger waste so far, by "
                                     "name: infra_failed_rate, masked_frac (of rollouts "
                                     "sampled), stale_token_frac, filter_token_frac, "
                                     "all_same_token_frac (of completion tokens sampled).",
                                     ["name"], registry=r)
        self.ledger_tokens = Gauge(f"{PREFIX}_ledger_tokens", "Run ledger completion tokens so "
                                   "far, by fate (run-api's counts, and the trainer's trained "
                                   "and dropped_poison).", ["fate"], registry=r)
        self.vllm_up = Gauge(f"{PREFIX}_vllm_up", "1 while the trainer's vLLM is healthy, 0 once "
                             "the health watch found it dead.", registry=r)
        self.port: int | None = None
        self._server: Any = None
        if port is not None:
            from prometheus_client import start_http_server

            self._server, _ = start_http_server(port, addr=host, registry=r)
            self.port = self._server.server_port

    def observe(self, step: int, record: dict[str, Any]) -> None:
        """Take one step's record (the dict logged to ``metrics.jsonl``; a RunLog observer).

        Evaluation records (``eval/...`` keys only) are ignored.
        """
        if "loss" not in record and "skipped_groups" not in record:
            return
        self.step.set(step)
        self._observe_ledger(record)
        if "batch_wait_seconds" in record:
            self.batch_wait.observe(record["batch_wait_seconds"])
        if "loss" not in record:  # a skipped step: nothing was trained
            self.steps.labels("skipped").inc()
            return
        self.steps.labels("trained").inc()
        self.compute.observe(record["step_seconds"])
        self.tokens_per_second.set(record["tokens_per_second"])
        self.trained_tokens.inc(record["trained_tokens"])
        self.loss.set(record["loss"])
        self.reward.set(record["reward/mean"])
        if "sync/update_seconds" in record:
            self.sync.observe(record.get("sync/save_seconds", 0.0) + record["sync/update_seconds"])
            self.vllm_policy_version.set(step)

    def _observe_ledger(self, record: dict[str, Any]) -> None:
        """Set the ledger gauges from a step record's ``ledger/tokens_*`` and fraction keys."""
        for name in ("infra_failed_rate", "masked_frac", "stale_token_frac", "filter_token_frac",
                     "all_same_token_frac"):
            if name in record:
                self.ledger_fraction.labels(name).set(record[name])
        for key, value in record.items():
            if key.startswith("ledger/tokens_"):
                self.ledger_tokens.labels(key.removeprefix("ledger/tokens_")).set(value)

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
