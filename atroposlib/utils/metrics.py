"""Summary statistics and a plain-text metrics table for logging."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence


def get_std_min_max_avg(name: str, values: Sequence[float]) -> dict[str, float]:
    """Return ``{name_mean, name_std, name_max, name_min}`` of ``values`` (population std).

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError(f"no values to summarise for {name!r}")
    return {
        f"{name}_mean": statistics.fmean(values),
        f"{name}_std": statistics.pstdev(values),
        f"{name}_max": max(values),
        f"{name}_min": min(values),
    }


def format_metrics_table(metrics: Mapping[str, float], title: str = "metrics") -> str:
    """Render ``metrics`` as an aligned two-column text table (for terminal output)."""
    if not metrics:
        return f"{title}: (no metrics)"
    width = max(len(k) for k in metrics)
    lines = [title, "-" * (width + 16)]
    for key, value in metrics.items():
        if isinstance(value, float) and math.isfinite(value):
            shown = f"{value:.4f}"
        else:
            shown = str(value)
        lines.append(f"{key.ljust(width)}  {shown}")
    return "\n".join(lines)


__all__ = ["format_metrics_table", "get_std_min_max_avg"]
