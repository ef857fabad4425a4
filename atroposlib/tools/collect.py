"""The loop shared by ``atropos-sft-gen`` and ``atropos-dpo-gen``: observe groups, select, write, count."""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from atroposlib.tools.formats import JsonlOutput, Layout, LayoutResolver, dpo_record, sft_record
from atroposlib.tools.observe import ObservedGroup
from atroposlib.tools.rollouts import RolloutFormatError, TokenDecoder
from atroposlib.tools.selection import pair_for_dpo, select_for_sft

logger = logging.getLogger(__name__)

#: Builds the lines for one group: (group, layout) -> (records, {skip_reason: count}).
RecordBuilder = Callable[[Mapping[str, Any], Layout], tuple[list[dict[str, Any]], Counter]]


@dataclass
class CollectStats:
    """Accounting of one collection run (printed at the end, and in the progress bar).

    Attributes:
        groups_seen: groups read from the API.
        groups_used: groups that contributed at least one line.
        lines_written: lines written to the output file by this run.
        skipped: ``{reason: count}`` of selected rollouts or pairs that could not be written.
        last_cursor: cursor of the last group read (resume with ``--after``), or None.
        missed_groups: groups that left the API's retention window before being read.
    """

    groups_seen: int = 0
    groups_used: int = 0
    lines_written: int = 0
    skipped: Counter = field(default_factory=Counter)
    last_cursor: int | None = None
    missed_groups: int = 0

    def summary(self) -> str:
        """One human-readable line."""
        skipped = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items())) or "none"
        missed = (f"; MISSED {self.missed_groups} groups that left the API's retention window "
                  "(raise run-api --observe-retention-groups/--observe-retention-tokens)"
                  if self.missed_groups else "")
        return (
            f"wrote {self.lines_written} lines from {self.groups_used} of {self.groups_seen} "
            f"groups; skipped: {skipped}; last cursor: {self.last_cursor}{missed}"
        )


def sft_builder(
    decoder: TokenDecoder,
    *,
    top_n: int,
    allow_negative_scores: bool,
    minimum_score_diff_max_min: float,
) -> RecordBuilder:
    """Record builder for SFT: rejection sampling (:func:`select_for_sft`) then :func:`sft_record`."""

    def build(group: Mapping[str, Any], layout: Layout) -> tuple[list[dict[str, Any]], Counter]:
        records: list[dict[str, Any]] = []
        skipped: Counter = Counter()
        for i in select_for_sft(
            group["scores"],
            top_n=top_n,
            allow_negative_scores=allow_negative_scores,
            minimum_score_diff_max_min=minimum_score_diff_max_min,
        ):
            try:
                records.append(sft_record(group, i, layout, decoder))
            except RolloutFormatError as exc:
                skipped[str(exc)] += 1
        return records, skipped

    return build


def dpo_builder(
    decoder: TokenDecoder,
    *,
    n_pairs: int,
    allow_negative_scores: bool,
    minimum_score_diff_max_min: float,
    rng: random.Random,
) -> RecordBuilder:
    """Record builder for DPO: pairing (:func:`pair_for_dpo`) then :func:`dpo_record`."""

    def build(group: Mapping[str, Any], layout: Layout) -> tuple[list[dict[str, Any]], Counter]:
        records: list[dict[str, Any]] = []
        skipped: Counter = Counter()
        for chosen, rejected in pair_for_dpo(
            group["scores"],
            n_pairs=n_pairs,
            allow_negative_scores=allow_negative_scores,
            minimum_score_diff_max_min=minimum_score_diff_max_min,
            rng=rng,
        ):
            try:
                records.append(dpo_record(group, chosen, rejected, layout, decoder))
            except RolloutFormatError as exc:
                skipped[str(exc)] += 1
        return records, skipped

    return build


def collect(
    groups: Iterable[ObservedGroup],
    build: RecordBuilder,
    output: JsonlOutput,
    resolver: LayoutResolver,
    *,
    target: int,
    progress: Any = None,
    stats: CollectStats | None = None,
) -> CollectStats:
    """Write lines built from ``groups`` until ``target`` lines are written or groups run out.

    Args:
        groups: observed groups, e.g. ``GroupObserver.follow()``.
        build: the per-group record builder (:func:`sft_builder` / :func:`dpo_builder`).
        output: where lines go.
        resolver: fixes the record layout of the file.
        target: stop after this many lines (``--num-seqs-to-save``); lines a group yields
            beyond the target are not written.
        progress: a tqdm bar (``total=target``) advanced by the lines written, or None.
        stats: accounting to update in place (so it survives an exception), or None for new.

    Returns:
        The run's accounting.

    Raises:
        ConfigError: a token-only group arrives and no tokenizer can be loaded.
    """
    stats = stats if stats is not None else CollectStats()
    warned: set[str] = set()
    if target <= 0:
        return stats
    for observed in groups:
        stats.groups_seen += 1
        stats.last_cursor = observed.cursor
        layout = resolver.resolve(observed.group)
        records, skipped = build(observed.group, layout)
        for reason, count in skipped.items():
            stats.skipped[reason] += count
            if reason not in warned:
                warned.add(reason)
                logger.warning("skipping rollouts of group %s: %s", observed.cursor, reason)
        records = records[: target - stats.lines_written]
        for record in records:
            output.write(record)
        if records:
            stats.groups_used += 1
            stats.lines_written += len(records)
        if progress is not None:
            progress.update(len(records))
            progress.set_postfix(groups=stats.groups_seen, skipped=sum(stats.skipped.values()),
                                 refresh=False)
        if stats.lines_written >= target:
            break
    return stats
