"""``make bench-docs`` renderers for the rollout-accounting benchmarks: learning under faults.

Each renderer takes the JSON payload(s) of its result file(s) and returns the markdown of one
block of ``docs/benchmarks.md`` (see :mod:`benchmarks.bench_docs`).
"""

from __future__ import annotations

from benchmarks.docs_tables import source, table

#: ``python benchmarks/bench_fault_curve.py --minutes 7 --loss gspo --rollout-timeout 60``
FAULT_CURVE = "bench_fault_curve_2026-12-07.json"


def fault_curve_table(payload: dict) -> str:
    """bench_fault_curve: accuracy of the clean and the faulted run at each wall point, and their ratios."""
    rows = []
    for point in payload["ratios"]:
        gain = point.get("gain_ratio")
        rows.append([f"{point['minute']:g}", f"{point['clean']:.3f}", f"{point['faults']:.3f}",
                     f"{point['ratio']:.3f}", "-" if gain is None else f"{gain:.2f}"])
    faults = payload["faults"]
    kinds = ", ".join(f"{n} {kind}" for kind, n in faults["by_kind"].items())
    rate = f"{100 * faults['rate']:g}%"
    text = table(["minute", "clean", f"{rate} faults", "accuracy ratio", "gain ratio"], rows)
    runs = payload.get("runs") or []
    steps = ", ".join(f"{run['label']} {run['steps']}" for run in runs if "steps" in run)
    ledgers = [(run["label"], run["ledger"]["rollouts"]) for run in runs if run.get("ledger")]
    failed = "; ".join(f"{label}: {r['failed']} of {r['sampled']} rollout attempts failed"
                       for label, r in ledgers)
    text += (f"\n\nOne pair (n = 1): {faults['injected']} faults injected ({kinds}), policy "
             f"`{faults['policy']}`, `rollout_timeout` {faults['rollout_timeout']:g} s in both runs"
             + (f"; training steps: {steps}" if steps else "") + (f"; run-api's ledger: {failed}" if failed else "")
             + ". The gain ratio is the accuracy "
             "gained over the base model, faulted over clean.\n\n" + source(FAULT_CURVE))
    return text


__all__ = ["FAULT_CURVE", "fault_curve_table"]
