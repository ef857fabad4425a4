"""The side-by-side table: per contender, accuracy over the wall points (mean and spread over its
runs), steps, samples/s, peak RSS (total and per part), dropped groups; the JSON and the PNG.

:func:`merge` combines the runs of several bench JSONs of the same task (pairs measured on
different days) into one table."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

GiB = 2**30


def spread(values: list[float]) -> dict[str, float]:
    """``{"mean", "min", "max", "std", "n"}`` of ``values`` (std 0 for one value)."""
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "n": len(values)}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One contender's row from its runs (each with ``curve``, ``steps``, ``peak_rss_*`` ...)."""
    minutes = [p["minute"] for p in runs[0]["curve"]]
    accuracy = {f"{m:g}": spread([r["curve"][i]["accuracy"] for r in runs])
                for i, m in enumerate(minutes)}
    parts = sorted({p for r in runs for p in r.get("peak_rss_by_part", {})})
    row: dict[str, Any] = {
        "runs": len(runs), "budget_minutes": runs[0]["budget_minutes"], "accuracy": accuracy,
        "steps": spread([float(r["steps"]) for r in runs]),
        "samples_per_second": spread([r["sequences"] / r["train_seconds"] if r["train_seconds"] else 0.0
                                      for r in runs]),
        "peak_rss_gib": spread([r["peak_rss_bytes"] / GiB for r in runs]),
        "peak_pss_gib": spread([r.get("peak_pss_bytes", 0) / GiB for r in runs]),
        "peak_rss_gib_by_part": {p: spread([r.get("peak_rss_by_part", {}).get(p, 0) / GiB for r in runs])
                                 for p in parts},
        "lr": runs[0].get("lr"), "env_args": runs[0].get("env_args", {}),
        "trainer_args": runs[0].get("trainer_args", {}), "trl_setting": runs[0].get("trl_setting"),
    }
    waits = [r["batch_wait_seconds"] for r in runs if "batch_wait_seconds" in r]
    if waits:
        row["batch_wait_seconds"] = spread(waits)
    finals = [r["groups"]["final"] for r in runs if (r.get("groups") or {}).get("final")]
    if finals:
        row["dropped_same_scores_share"] = spread(
            [f["dropped_same_scores"] / f["sampled"] if f["sampled"] else 0.0 for f in finals])
    wastes = [waste_fractions(r["ledger"]) for r in runs if (r.get("ledger") or {}).get("tokens")]
    if wastes:
        row["waste_token_frac"] = {key: spread([w[key] for w in wastes]) for key in wastes[0]}
    return row


def waste_fractions(ledger: dict[str, Any]) -> dict[str, float]:
    """Where a run's sampled tokens were wasted, from its ledger (``summary.json``'s ``ledger``).

    Returns:
        Fractions of the tokens sampled: ``stale`` (dropped as too old for the trainer),
        ``all_same`` (in groups dropped because every score was equal), ``filtered`` (every
        filter drop, ``all_same`` included) and ``waste`` (``stale + filtered``).
    """
    tokens = ledger["tokens"]
    sampled = tokens["sampled"] or 1
    same = ((ledger.get("dropped_filter_by_reason") or {}).get("same_scores") or {}).get("tokens", 0)
    return {"stale": tokens["dropped_stale"] / sampled, "all_same": same / sampled,
            "filtered": tokens["dropped_filter"] / sampled,
            "waste": (tokens["dropped_stale"] + tokens["dropped_filter"]) / sampled}


def report(runs: list[dict[str, Any]], task: dict[str, Any], json_out: Path, plot_out: Path,
           extra: dict[str, Any] | None = None, seeds: Any = None,
           argv: list[str] | None = None) -> dict[str, Any]:
    """Print the table, write the result file (rows, every run, ``extra``) and the accuracy PNG.

    The file is written by :func:`benchmarks.results.write_result` (with its ``meta`` record:
    command (``argv``, default ``sys.argv``), git commit, machine, date and ``seeds``).

    Returns:
        The JSON payload, ``meta`` included.
    """
    labels = list(dict.fromkeys(r["label"] for r in runs))
    table = {label: summarise([r for r in runs if r["label"] == label]) for label in labels}
    print_table(table)
    payload = {"contenders": table, "task": task, **(extra or {}),
               "runs": [{k: v for k, v in r.items() if k != "points"} for r in runs]}
    from benchmarks.results import write_result

    payload = write_result(json_out, "bench_learning", payload, seeds=seeds, argv=argv)
    plot(runs, labels, task, plot_out)
    print(f"[bench] wrote {json_out} and {plot_out}", flush=True)
    return payload


def print_table(table: dict[str, Any]) -> None:
    """The rows as text: accuracy at each point as mean [min-max], then steps, samples/s, RSS."""
    for label, row in table.items():
        acc = "  ".join(f"{m}m {a['mean']:.3f} [{a['min']:.3f}-{a['max']:.3f}]"
                        for m, a in row["accuracy"].items())
        parts = ", ".join(f"{p} {s['max']:.2f}" for p, s in row["peak_rss_gib_by_part"].items())
        dropped = row.get("dropped_same_scores_share")
        waste = row.get("waste_token_frac")
        print(f"{label} (x{row['runs']}): {acc}\n"
              f"    steps {row['steps']['mean']:.0f} [{row['steps']['min']:.0f}-{row['steps']['max']:.0f}]"
              f"  samples/s {row['samples_per_second']['mean']:.2f}"
              f"  peak RSS {row['peak_rss_gib']['max']:.2f} GiB ({parts}), PSS {row['peak_pss_gib']['max']:.2f}"
              + (f"  dropped as same scores {dropped['mean']:.0%}" if dropped else "")
              + (f"  trainer waited {row['batch_wait_seconds']['mean']:.0f} s" if "batch_wait_seconds" in row else "")
              + (f"  wasted tokens {waste['waste']['mean']:.0%} (stale {waste['stale']['mean']:.0%},"
                 f" all-same {waste['all_same']['mean']:.0%})" if waste else ""),
              flush=True)


def plot(runs: list[dict[str, Any]], labels: list[str], task: dict[str, Any], plot_out: Path) -> None:
    """Accuracy against training minutes, one colour per contender, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, label in enumerate(labels):
        for j, run in enumerate(r for r in runs if r["label"] == label):
            ax.plot([p["minute"] for p in run["curve"]], [p["accuracy"] for p in run["curve"]],
                    marker="o", color=colours[i % len(colours)], alpha=0.8,
                    label=label if j == 0 else None)
    ax.set_xlabel("training wall time (minutes)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title(f"arithmetic (difficulty {task['difficulty']}), SmolLM2-135M, same budget")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(plot_out, dpi=120)
    plt.close(fig)


def best_trl(table: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The TRL row with the highest mean final accuracy (ties: the earlier row), or None."""
    rows = [(label, row) for label, row in table.items() if row.get("trl_setting")]
    if not rows:
        return None
    last = lambda row: list(row["accuracy"].values())[-1]["mean"]  # noqa: E731
    return max(rows, key=lambda lr: (last(lr[1]), -rows.index(lr)))



#: task keys that must agree between merged JSONs (the others say how the runs were ordered)
SAME_TASK_KEYS = ("model", "env", "difficulty", "max_tokens", "group_size", "batch_size",
                  "trainable_layers", "eval_problems", "minutes")
#: run keys that must agree between merged runs of one label (one row is one way of running);
#: a run that predates ``trainer_args`` counts as having none
SAME_RUN_KEYS = ("lr", "env_args", "trainer_args", "trl_setting")


def merge(payloads: list[tuple[str, dict[str, Any]]]) -> tuple[list[dict[str, Any]], dict[str, Any],
                                                               dict[str, Any]]:
    """The runs, task and extras of one table made from several bench JSONs.

    Args:
        payloads: ``(name, payload)`` per JSON, in order; ``payload`` as :func:`report` wrote it.

    Returns:
        ``(runs, task, extra)`` for :func:`report`. Runs keep their order; their ``pass`` is
        renumbered to follow the previous file's last pass, and ``source`` names their file.
        ``task`` is the first file's, with ``pairs`` the number of passes in all, ``order``
        every file's order and ``merged_from`` the names. A file that is itself a merged table
        adds the files it was merged from, their orders and its runs' sources, so a third pair
        can join a two-pair table. ``extra`` has ``trl_sweep``, its best
        recomputed over every TRL row, when any file had one.

    Raises:
        ValueError: fewer than two files, a file without runs, a task key of
            :data:`SAME_TASK_KEYS` that differs, or runs of one label with different
            :data:`SAME_RUN_KEYS` (the message names the key and both values).
    """
    if len(payloads) < 2:
        raise ValueError(f"merge needs at least two JSONs, got {len(payloads)}")
    first_name, first = payloads[0]
    runs: list[dict[str, Any]] = []
    orders, settings, sources = [], [], []
    for name, payload in payloads:
        if not payload.get("runs"):
            raise ValueError(f"{name} has no runs: is it a bench_learning.py JSON?")
        for key in SAME_TASK_KEYS:
            ours, theirs = first["task"].get(key), payload["task"].get(key)
            if ours != theirs:
                raise ValueError(f"task {key!r} differs: {ours!r} in {first_name}, {theirs!r} in "
                                 f"{name}; only runs of the same task make one table")
        offset = max((r["pass"] for r in runs), default=0)
        merged = "merged_from" in payload["task"]  # a table merged before: keep its runs' files
        runs += [{**r, "pass": r["pass"] + offset, "source": r.get("source", name) if merged else name}
                 for r in payload["runs"]]
        if merged:
            orders += payload["task"].get("order") or []
            sources += payload["task"]["merged_from"]
        else:
            orders.append(payload["task"].get("order"))
            sources.append(name)
        settings += [s for s in (payload.get("trl_sweep") or {}).get("settings", []) if s not in settings]
    seen: dict[str, dict[str, Any]] = {}
    for run in runs:  # one row averages runs of one contender, run the same way
        earlier = seen.setdefault(run["label"], run)
        for key in SAME_RUN_KEYS:
            before, now = _setting(earlier, key), _setting(run, key)
            if before != now:
                raise ValueError(f"{run['label']}: {key} differs: {before!r} in "
                                 f"{earlier['source']}, {now!r} in {run['source']}")
    task = {**first["task"], "pairs": max(r["pass"] for r in runs), "order": orders,
            "merged_from": sources}
    extra = {"trl_sweep": sweep_summary(runs, settings)} if settings else {}
    return runs, task, extra


def _setting(run: dict[str, Any], key: str) -> Any:
    """``run[key]``; a missing ``trainer_args`` (a JSON from before it was recorded) is ``{}``."""
    return run.get(key, {} if key == "trainer_args" else None)


def sweep_summary(runs: list[dict[str, Any]], settings: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON's ``trl_sweep``: the settings swept and the best of their rows.

    Args:
        runs: every run; those whose ``trl_setting`` is one of ``settings`` are the sweep's.
        settings: the swept :class:`~benchmarks.learning.trl_side.TrlSetting` s, as dicts.

    Returns:
        ``{"settings", "best": {"label", "setting", "final_accuracy"}}``, the best by
        :func:`best_trl`.

    Raises:
        ValueError: no run of any of ``settings``.
    """
    labels = list(dict.fromkeys(r["label"] for r in runs if r.get("trl_setting") in settings))
    best = best_trl({label: summarise([r for r in runs if r["label"] == label]) for label in labels})
    if best is None:
        raise ValueError("no TRL run of the sweep's settings finished")
    label, row = best
    return {"settings": settings, "best": {"label": label, "setting": row["trl_setting"],
                                           "final_accuracy": list(row["accuracy"].values())[-1]}}
