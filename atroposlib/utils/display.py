"""The evaluation results table Atropos 0.4 printed after ``evaluate`` (lm-eval-harness look)."""

from __future__ import annotations

from collections.abc import Mapping


def metrics_table_lines(task_name: str, metrics: Mapping[str, float]) -> list[str]:
    """Markdown table rows, one per metric, in the column layout of lm-evaluation-harness.

    Columns: Groups (the task), Version (1), Filter (none), n-shot (blank), Metric (the key
    without an ``eval/`` prefix, ``_`` as spaces), an up-arrow when higher is better (the key
    mentions ``acc`` or ``correct``), Value (4 decimals), ``±`` and Stderr (always 0.0000: one
    run gives no standard error).

    Raises:
        ValueError: ``metrics`` is empty.
    """
    if not metrics:
        raise ValueError(f"no metrics to display for {task_name!r}")
    rows = []
    for key, value in metrics.items():
        arrow = "↑" if ("acc" in key or "correct" in key) else ""
        rows.append([task_name, "1", "none", "", key.removeprefix("eval/").replace("_", " "),
                     arrow, f"{value:.4f}", "±", "0.0000"])
    header = ["Groups", "Version", "Filter", "n-shot", "Metric", "", "Value", "", "Stderr"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    widths[5] = widths[7] = max(widths[5], 3)
    right = {6, 8}

    def fmt(cells: list[str]) -> str:
        return "|" + "|".join(
            c.rjust(w) if i in right else (c.center(w) if i in (5, 7) else c.ljust(w))
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))) + "|"

    rule = "|" + "|".join(("-" * (w - 1) + ":") if i in right else "-" * w
                          for i, w in enumerate(widths)) + "|"
    return [fmt(header), rule, *(fmt(r) for r in rows)]


def display_metrics_table(
    task_name: str, metrics: Mapping[str, float], start_time: float, end_time: float
) -> None:
    """Print ``metrics`` as a markdown table under a title, then the elapsed time.

    Args:
        task_name: the evaluated task (first column).
        metrics: metric name -> value (floats).
        start_time: evaluation start, Unix seconds.
        end_time: evaluation end, Unix seconds.

    Raises:
        ValueError: ``metrics`` is empty.
    """
    print(f"\nEvaluation Results: {task_name}")
    print("\n".join(metrics_table_lines(task_name, metrics)))
    print(f"Evaluation completed in {end_time - start_time:.2f} seconds")
