"""The trainer's half of the run ledger: what became of the tokens run-api served it.

run-api's ledger (``GET /ledger``, see ``docs/guides/ledger.md``) accounts for every sampled
rollout and completion token up to the moment a batch is served. The trainer splits the served
tokens into ``trained`` (groups it trained on) and ``dropped_poison`` (groups its batch checks
dropped, :mod:`example_trainer.batch_checks`), so the run's token identity reads::

    sampled = trained + dropped_stale + dropped_filter + dropped_poison + dropped_masked
              + queued_at_end

and ``summary.json``'s ``ledger`` section says whether it closes. Tokens are completion tokens:
labels (the wire's ``masks``) that are not -100. Each step's ``metrics.jsonl`` record carries
the counts so far (``ledger/...``) and the waste fractions ``infra_failed_rate``,
``masked_frac``, ``stale_token_frac``, ``filter_token_frac`` and ``all_same_token_frac``.
Against a server without a ledger (a stock Atropos run-api) only the trainer's own counts are
logged and the summary says ``"source": "trainer"``.
"""

from __future__ import annotations

from typing import Any

from atroposlib.api.ledger import group_counts

__all__ = ["TrainerLedger"]

#: the per-step keys that hold counts so far (read back from metrics.jsonl on a resume)
TRAINED, POISON = "ledger/tokens_trained", "ledger/tokens_dropped_poison"


def _tokens(groups: list[dict[str, Any]]) -> int:
    return sum(group_counts(g)["tokens"] for g in groups)


class TrainerLedger:
    """Counts the served tokens the trainer trained on or dropped, and reads run-api's ledger.

    Args:
        trained: completion tokens trained on before this process (a resume: from metrics.jsonl).
        poison: completion tokens dropped by the batch checks before this process.

    Attributes:
        client: rank 0's :class:`~atroposlib.api.client.AtroposClient` once registered (None:
            run-api is not asked; the other FSDP ranks).
        api: run-api's last ``GET /ledger`` answer, or None (none yet, or no such route).
    """

    def __init__(self, trained: int = 0, poison: int = 0):
        """Start from the counts of the steps already trained (0 for a new run)."""
        self.trained, self.poison = trained, poison
        self.client: Any = None
        self.api: dict[str, Any] | None = None
        self._api_has_ledger = True

    @classmethod
    def resumed(cls, past: list[dict[str, Any]]) -> TrainerLedger:
        """A ledger that goes on from the newest ``metrics.jsonl`` record (up to the checkpoint) that has counts."""
        last = next((r for r in reversed(past) if TRAINED in r), {})
        return cls(int(last.get(TRAINED, 0)), int(last.get(POISON, 0)))

    def fetch(self) -> dict[str, Any] | None:
        """Ask run-api for its ledger (once per step); None when it has none (404) or no answer."""
        from atroposlib.errors import ApiError, ApiRejectedError

        if self.client is None or not self._api_has_ledger:
            return self.api
        try:
            self.api = self.client.request("GET", "/ledger")
        except ApiRejectedError as exc:
            if exc.status_code == 404:  # an Atropos 0.4 server: no ledger, ask no more
                self._api_has_ledger = False
        except ApiError:
            pass  # a transient failure: keep the last answer
        return self.api

    def step(self, fetched: list[dict[str, Any]], kept: list[dict[str, Any]]) -> dict[str, float]:
        """Count one step's batch and return its ``metrics.jsonl`` fields.

        Args:
            fetched: the groups ``GET /batch`` served for the step.
            kept: those the batch checks kept (and the step trained on; ``[]`` for a skipped step).

        Returns:
            ``ledger/tokens_trained`` and ``ledger/tokens_dropped_poison`` (this run so far),
            run-api's counts so far (``ledger/rollouts_<outcome>``, ``ledger/tokens_<fate>``)
            and the fractions (see the module docstring) when run-api keeps a ledger.
        """
        kept_ids = {id(g) for g in kept}
        self.trained += _tokens(kept)
        self.poison += _tokens([g for g in fetched if id(g) not in kept_ids])
        out: dict[str, float] = {TRAINED: self.trained, POISON: self.poison}
        api = self.fetch()
        if api is not None:
            out.update({f"ledger/rollouts_{k}": v for k, v in api["rollouts"].items()})
            out.update({f"ledger/tokens_{k}": v for k, v in api["tokens"].items()})
            out.update(waste(api))
        return out

    def summary(self, refresh: bool = True) -> dict[str, Any]:
        """The ``ledger`` section of ``summary.json``.

        Args:
            refresh: ask run-api once more, for its counts at the end (False after a failure,
                which may be run-api's: then the last step's answer is used).
        """
        tokens: dict[str, Any] = {"trained": self.trained, "dropped_poison": self.poison}
        api = self.fetch() if refresh else self.api
        if api is None:
            return {"source": "trainer", "tokens": tokens, "closes": None}
        t = api["tokens"]
        tokens = {"sampled": t["sampled"], "trained": self.trained,
                  "dropped_stale": t["dropped_stale"], "dropped_filter": t["dropped_filter"],
                  "dropped_poison": self.poison, "dropped_masked": t["dropped_masked"],
                  "queued_at_end": t["queued"]}
        unaccounted = tokens["sampled"] - sum(v for k, v in tokens.items() if k != "sampled")
        r = api["rollouts"]
        closes = (unaccounted == 0 and r["sampled"] == r["completed"] + r["masked"] + r["failed"]
                  and bool(api.get("closes")))
        return {"source": "run-api", "rollouts": dict(r), "tokens": tokens,
                "served_tokens": t["served"], "unaccounted_tokens": unaccounted, "closes": closes,
                "waste": waste(api), "dropped_filter_by_reason": api.get("dropped_filter_by_reason", {})}


def waste(api: dict[str, Any]) -> dict[str, float]:
    """The waste fractions of run-api's ledger so far (0 before anything was sampled).

    ``infra_failed_rate`` and ``masked_frac`` are failed and masked rollouts over rollouts
    sampled (every failed attempt counts; the wire does not say which kind a retried attempt
    failed with); ``stale_token_frac``, ``filter_token_frac`` and ``all_same_token_frac`` are
    tokens dropped as stale, by the env's filters, and with groups whose scores were all the
    same (a part of the filtered ones), over completion tokens sampled.
    """
    r, t = api["rollouts"], api["tokens"]
    same = (api.get("dropped_filter_by_reason") or {}).get("same_scores", {}).get("tokens", 0)
    return {"infra_failed_rate": r["failed"] / max(r["sampled"], 1),
            "masked_frac": r["masked"] / max(r["sampled"], 1),
            "stale_token_frac": t["dropped_stale"] / max(t["sampled"], 1),
            "filter_token_frac": t["dropped_filter"] / max(t["sampled"], 1),
            "all_same_token_frac": same / max(t["sampled"], 1)}
