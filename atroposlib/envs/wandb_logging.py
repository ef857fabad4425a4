"""What an env logs to W&B: its training metrics and the ``train/rollouts`` table.

Pure functions over the env's recorded numbers, and :class:`WandbLoggingMixin`, whose thin
methods (``wandb_log``, ``add_rollouts_for_wandb``, ``create_rollout_table``, ``perf_stats``)
``BaseEnv`` inherits and an env overrides. ``wandb`` is imported only when logging.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from atroposlib.envs.groups import ScoredDataGroup
from atroposlib.utils.metrics import get_std_min_max_avg

#: One row of the rollout table: ``(text, score, *extra_columns)``.
RolloutRow = tuple[Any, ...]


def decode_for_log(group: ScoredDataGroup, index: int, decode: Callable[[list[int]], str]) -> str:
    """Text of sequence ``index`` for the rollout table.

    The chat transcript (``role: content`` turns) when the group has ``messages``, else
    ``decode(tokens)``; when decoding fails (e.g. no tokenizer offline), the first 64 token
    ids as text: logging is best-effort and never drops a group.
    """
    messages = group.get("messages")
    if messages:
        return "\n\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages[index])
    try:
        return decode(group["tokens"][index])
    except Exception:  # noqa: BLE001 - logging text is best-effort
        return str(group["tokens"][index][:64])


def rollout_rows(
    group: ScoredDataGroup, keep: int, decode: Callable[[list[int]], str]
) -> list[RolloutRow]:
    """The first ``keep`` sequences of ``group`` as ``(text, score)`` rows (-1 = all).

    Returns ``[]`` when ``keep`` is 0 or less (other than -1).
    """
    size = len(group["tokens"])
    keep = size if keep == -1 else keep
    return [
        (decode_for_log(group, i, decode), group["scores"][i]) for i in range(min(max(keep, 0), size))
    ]


def rollout_table(groups: Iterable[Sequence[RolloutRow]]) -> Any:
    """A ``wandb.Table`` of every row: columns ``text``, ``score``, then ``extra_0`` ...

    Rows shorter than the widest row are padded with None (custom ``add_rollouts_for_wandb``
    overrides may log more columns).
    """
    import wandb

    groups = [list(rows) for rows in groups]
    width = max((len(row) for rows in groups for row in rows), default=2)
    table = wandb.Table(columns=["text", "score"] + [f"extra_{i}" for i in range(width - 2)])
    for rows in groups:
        for row in rows:
            table.add_data(*row, *([None] * (width - len(row))))
    return table


def perf_stats(task_durations: Sequence[float]) -> dict[str, float]:
    """``train_perf/task_duration_{mean,std,max,min}`` of rollout-group durations in seconds."""
    if not task_durations:
        return {}
    return get_std_min_max_avg("train_perf/task_duration", list(task_durations))


def env_metrics(
    metrics: Mapping[str, Any],
    completion_lengths: Sequence[int],
    length_limit: int,
    perf: Mapping[str, float],
    stats: Mapping[str, int],
    prefix: str = "",
) -> dict[str, Any]:
    """The env's W&B metrics: ``metrics`` plus its standard keys, every key prefixed.

    Added: ``train/completion_lengths`` (mean, in trained tokens) with ``_std``, ``_max``,
    ``_min`` and ``_frac_over_95pct_max`` (share of sequences over ``0.95 * length_limit``
    tokens), when there are lengths; ``perf`` as given; ``train/<counter>`` for each of
    ``stats``. Every key then gets ``prefix`` (e.g. ``"gsm8k_"``).
    """
    out = dict(metrics)
    if completion_lengths:
        lengths = list(completion_lengths)
        spread = get_std_min_max_avg("train/completion_lengths", lengths)
        out["train/completion_lengths"] = spread.pop("train/completion_lengths_mean")
        out.update(spread)
        out["train/completion_lengths_frac_over_95pct_max"] = sum(
            1 for x in lengths if x > 0.95 * length_limit
        ) / len(lengths)
    out.update(perf)
    for key, value in stats.items():
        out[f"train/{key}"] = value
    return {f"{prefix}{k}": v for k, v in out.items()}


class WandbLoggingMixin:
    """``BaseEnv``'s W&B hooks; override them and call ``super()`` to add metrics or columns.

    Reads what ``BaseEnv`` sets: ``config`` (``use_wandb``, ``max_seq_len``,
    ``num_rollouts_per_group_for_logging``), ``tokenizer``, ``server`` (its
    ``wandb_metrics()``), ``rollouts_for_wandb`` (a bounded deque of row lists) and the run
    state's ``curr_step``, ``max_seq_len``, ``wandb_prepend``, ``completion_lengths``,
    ``task_durations`` and ``stats``.
    """

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    def add_rollouts_for_wandb(self, scored_data: ScoredDataGroup, item: Any = None) -> None:
        """Keep some rollouts of an accepted group for the W&B ``train/rollouts`` table.

        Override to log other columns (then also override ``create_rollout_table``). Default:
        ``num_rollouts_per_group_for_logging`` rows of ``(text, score)``; the last
        ``num_rollouts_to_keep`` groups are kept.
        """
        keep = self.config.num_rollouts_per_group_for_logging
        rows = rollout_rows(scored_data, keep, self._decode)
        if rows:
            self.rollouts_for_wandb.append(rows)

    def create_rollout_table(self, wandb_metrics: dict[str, Any]) -> dict[str, Any]:
        """Add the ``train/rollouts`` W&B table built from ``rollouts_for_wandb``; return the dict."""
        if not self.rollouts_for_wandb:
            return wandb_metrics
        prefix = f"{self.wandb_prepend}_" if self.wandb_prepend else ""
        wandb_metrics[f"{prefix}train/rollouts"] = rollout_table(self.rollouts_for_wandb)
        self.rollouts_for_wandb.clear()
        return wandb_metrics

    def perf_stats(self) -> dict[str, float]:
        """Mean/std/max/min of recent rollout-group durations (seconds)."""
        return perf_stats(self.task_durations)

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        """Log the usual metrics (plus ``metrics``) to W&B when ``use_wandb``.

        Subclasses add their own keys and call ``await super().wandb_log(metrics)`` last.
        Logged: ``train/completion_lengths`` (+ ``_std``, ``_max``, ``_min``,
        ``_frac_over_95pct_max``), the ``train/rollouts`` table, ``train_perf/*``,
        ``train/groups_*`` counters and every server's request metrics.
        """
        if not self.config.use_wandb:
            self.completion_lengths.clear()
            return
        trainer_limit = self.run_state.max_seq_len
        limit = trainer_limit if trainer_limit > 0 else self.config.max_seq_len
        prefix = f"{self.wandb_prepend}_" if self.wandb_prepend else ""
        metrics = env_metrics(metrics or {}, self.completion_lengths, limit, self.perf_stats(),
                              self.stats, prefix)
        self.completion_lengths.clear()
        metrics.update(self.server.wandb_metrics())
        import wandb

        if wandb.run is None:
            return
        metrics = self.create_rollout_table(metrics)
        wandb.log(metrics, step=self.curr_step if self.curr_step > 0 else None)


__all__ = [
    "WandbLoggingMixin",
    "decode_for_log",
    "env_metrics",
    "perf_stats",
    "rollout_rows",
    "rollout_table",
]
