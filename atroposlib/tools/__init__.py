"""Offline dataset tools (SFT / DPO generation, run viewer) that read a live run without disturbing it."""

from atroposlib.tools.collect import CollectStats, collect, dpo_builder, sft_builder
from atroposlib.tools.formats import (
    JsonlOutput,
    Layout,
    LayoutResolver,
    OutputFormat,
    dpo_record,
    sft_record,
)
from atroposlib.tools.observe import GroupObserver, ObservedGroup, RecentGroups
from atroposlib.tools.rollouts import (
    RolloutFormatError,
    TokenDecoder,
    first_trained_position,
    split_messages,
)
from atroposlib.tools.selection import pair_for_dpo, select_for_sft

__all__ = [
    "CollectStats",
    "GroupObserver",
    "JsonlOutput",
    "Layout",
    "LayoutResolver",
    "ObservedGroup",
    "OutputFormat",
    "RecentGroups",
    "RolloutFormatError",
    "TokenDecoder",
    "collect",
    "dpo_builder",
    "dpo_record",
    "first_trained_position",
    "pair_for_dpo",
    "select_for_sft",
    "sft_builder",
    "sft_record",
    "split_messages",
]
