"""Check every batch before the forward pass: a bad group is dropped with one error line, never trained on.

run-api checks groups when they are posted, but an Atropos 0.4 server (or an older run-api)
checks almost nothing, and only the trainer knows its model: so the trainer checks every
batch again. A group is dropped, with its reason, when any of its sequences has:

===================  ==============================================================================
reason               what is wrong
===================  ==============================================================================
``shape``            rows or per-token arrays (masks, advantages, log-probs, teacher arrays) whose
                     lengths disagree with ``tokens``
``empty``            an empty sequence, or one of a single token (nothing to predict)
``too_long``         more than ``max_seq_len`` tokens (never truncated: a cut completion would be
                     trained with the reward of the whole one)
``token_range``      a token id outside ``[0, vocab_size)``
``label_range``      a label (``masks``) outside ``[0, vocab_size)`` that is not ``IGNORE_INDEX``
``label_mismatch``   a trained label that differs from the token at its position (the trainer takes
                     its targets from the labels, so the sequence would teach other tokens)
``no_trained_token`` no trained label after the first position (every target masked)
``score``            a score or per-token advantage that is not finite or exceeds :data:`MAX_ABS_SCORE`
===================  ==============================================================================

``vocab_size`` is the number of rows of the model's input embedding: ids at or above it crash
the forward pass. The first problem found names the group; its error line gives the env id,
the group's place in the batch, the position and the likely cause (for ids and labels: a
tokenizer mismatch between the env and the trainer).

Only the bad groups are dropped and the step trains on the rest: the loss normalises by the
step's own sequence and token counts, so fewer sequences are fine. Under FSDP every rank must
run the same number of micro-batches, so there a bad group drops the whole batch. A batch with
nothing left is skipped: the step still counts (run-api numbered it when it served it), no
optimiser update is made, and the batch is never fetched again.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from atroposlib.api.models import IGNORE_INDEX

#: Largest absolute score or per-token advantage accepted. Rewards of RL environments are O(1)
#: to O(100); a bigger value is a sentinel or an overflow (1e308 turns the group's std into inf
#: and its advantages into NaN).
MAX_ABS_SCORE = 1e6

#: What most likely caused each reason, for the error line.
LIKELY_CAUSE = {
    "shape": "the env built the group's arrays with different lengths",
    "empty": "the env sent a sequence with nothing to train on (empty rollout)",
    "too_long": "the env's max_token_length is larger than the trainer's --max-token-len; make "
                "them equal",
    "token_range": "a tokenizer mismatch: the env must tokenize with the tokenizer of the "
                   "trainer's --model",
    "label_range": "a tokenizer mismatch, or masks that hold something other than -100 or the "
                   "token id",
    "label_mismatch": "a tokenizer mismatch, or masks built from other tokens than the sequence "
                      "(masks must hold the token id itself at trained positions, -100 elsewhere)",
    "no_trained_token": "every position is masked with -100 (the env masked the completion too)",
    "score": "a reward function returned a sentinel or overflowed (scores and advantages must be "
             f"finite and within +-{MAX_ABS_SCORE:g})",
}
REASONS = tuple(LIKELY_CAUSE)


@dataclass(frozen=True)
class BadGroup:
    """A group the trainer will not train on.

    Attributes:
        index: the group's place in the batch (0-based).
        size: groups in the batch.
        env_id: the group's ``env_id`` (None when it carries none).
        reason: one of :data:`REASONS`.
        detail: what was found, and where (sequence and position).
    """

    index: int
    size: int
    env_id: Any
    reason: str
    detail: str

    def message(self, step: int) -> str:
        """The one error line for this group (without a prefix)."""
        return (f"step {step}: dropped group {self.index + 1} of {self.size} (env {self.env_id}): "
                f"{self.detail}. Likely cause: {LIKELY_CAUSE[self.reason]}")


def check_group(group: dict[str, Any], vocab_size: int, max_seq_len: int) -> tuple[str, str] | None:
    """The first problem of one wire group, or None when it can be trained on.

    Args:
        group: a group as ``GET /batch`` serves it.
        vocab_size: rows of the model's input embedding (token ids must be below it).
        max_seq_len: longest sequence accepted, in tokens.

    Returns:
        ``(reason, detail)`` (``reason`` one of :data:`REASONS`) or None.
    """
    tokens, masks, scores = group.get("tokens") or [], group.get("masks") or [], group.get("scores") or []
    if not tokens or not len(tokens) == len(masks) == len(scores):
        return "shape", (f"tokens/masks/scores have {len(tokens)}/{len(masks)}/{len(scores)} rows; "
                         "every group needs one row per sequence")
    for name in ("advantages", "inference_logprobs", "ref_logprobs", "distill_token_ids",
                 "distill_logprobs"):
        rows = group.get(name)
        if rows is not None and len(rows) != len(tokens):
            return "shape", f"{name} has {len(rows)} rows for {len(tokens)} sequences"
    for i, (toks, labels) in enumerate(zip(tokens, masks, strict=True)):
        problem = _check_sequence(group, i, toks, labels, vocab_size, max_seq_len)
        if problem is not None:
            return problem
    for i, score in enumerate(scores):
        if not _finite_within(score):
            return "score", f"sequence {i} has score {score!r}"
    return None


def _check_sequence(group: dict[str, Any], i: int, toks: list[int], labels: list[int],
                    vocab_size: int, max_seq_len: int) -> tuple[str, str] | None:
    """The first problem of sequence ``i`` of ``group`` (see :func:`check_group`)."""
    n = len(toks)
    if len(labels) != n:
        return "shape", f"sequence {i} has {n} tokens but {len(labels)} masks"
    for name in ("advantages", "inference_logprobs", "ref_logprobs", "distill_token_ids",
                 "distill_logprobs"):
        rows = group.get(name)
        if rows is not None and rows[i] is not None and len(rows[i]) != n:
            return "shape", f"sequence {i} has {n} tokens but {len(rows[i])} {name}"
    if n < 2:
        return "empty", f"sequence {i} has {n} token{'s' if n != 1 else ''}, nothing to predict"
    if n > max_seq_len:
        return "too_long", f"sequence {i} has {n} tokens, more than --max-token-len {max_seq_len}"
    low, high = min(toks), max(toks)
    if low < 0 or high >= vocab_size:
        j, bad = next((j, t) for j, t in enumerate(toks) if not 0 <= t < vocab_size)
        return "token_range", (f"sequence {i} position {j} has token id {bad}, outside the model's "
                               f"vocabulary [0, {vocab_size})")
    trained = False
    for j, (token, label) in enumerate(zip(toks, labels, strict=True)):
        if label == IGNORE_INDEX:
            continue
        if not 0 <= label < vocab_size:
            return "label_range", (f"sequence {i} position {j} has label {label}, neither "
                                   f"{IGNORE_INDEX} nor an id in [0, {vocab_size})")
        if label != token:
            return "label_mismatch", (f"sequence {i} position {j} has label {label} but token "
                                      f"{token}")
        trained = trained or j > 0
    if not trained:
        return "no_trained_token", f"sequence {i} has no trained position (all masks {IGNORE_INDEX})"
    advantages = group.get("advantages")
    if advantages is not None and advantages[i] is not None:
        bad = next((a for a in advantages[i] if not _finite_within(a)), None)
        if bad is not None:
            return "score", f"sequence {i} has advantage {bad!r}"
    d_ids = group.get("distill_token_ids")
    if d_ids is not None and d_ids[i] is not None:
        bad = next((t for pos in d_ids[i] for t in pos if not 0 <= t < vocab_size), None)
        if bad is not None:
            return "token_range", (f"sequence {i} has teacher candidate id {bad}, outside the "
                                   f"model's vocabulary [0, {vocab_size})")
    return None


def _finite_within(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and abs(value) <= MAX_ABS_SCORE


class BatchGuard:
    """Checks every batch of a run and keeps the counts of what it dropped.

    Args:
        vocab_size: rows of the model's input embedding.
        max_seq_len: the trainer's ``--max-token-len``.
        whole_batch: drop the whole batch when one group is bad (FSDP: every rank must run
            the same micro-batches).
        report: print the error lines (False on the FSDP ranks other than 0, which check the
            same batch).
        on_drop: called with the reason of every dropped group (e.g. a metrics counter).
        on_skip: called once for every batch of which nothing is left.

    Attributes:
        groups_by_reason: dropped groups per reason over the run.
        batches_skipped: batches of which nothing was left to train on.
        last_step_dropped: groups dropped from the last checked batch.
    """

    def __init__(self, vocab_size: int, max_seq_len: int, whole_batch: bool = False,
                 report: bool = True, on_drop: Callable[[str], Any] | None = None,
                 on_skip: Callable[[], Any] | None = None):
        """Set the limits; nothing is checked until :meth:`filter`."""
        self.report = report
        self.on_drop = on_drop
        self.on_skip = on_skip
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.whole_batch = whole_batch
        self.groups_by_reason: Counter[str] = Counter()
        self.batches_skipped = 0
        self.last_step_dropped = 0

    def filter(self, step: int, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The groups of ``batch`` that can be trained on; prints one error line per bad group.

        Returns:
            The good groups in their order (all of them when none is bad), or ``[]`` when
            nothing is left (every group bad, or one bad under ``whole_batch``).
        """
        bad = []
        for index, group in enumerate(batch):
            problem = check_group(group, self.vocab_size, self.max_seq_len)
            if problem is not None:
                bad.append(BadGroup(index, len(batch), group.get("env_id"), *problem))
        for item in bad:
            self._print(item.message(step))
            self.groups_by_reason[item.reason] += 1
            if self.on_drop is not None:
                self.on_drop(item.reason)
        dropped = {item.index for item in bad}
        kept = [] if bad and self.whole_batch else [g for i, g in enumerate(batch) if i not in dropped]
        self.last_step_dropped = len(batch) - len(kept)
        if bad and not kept:
            self.batches_skipped += 1
            if self.on_skip is not None:
                self.on_skip()
            why = "FSDP trains whole batches only" if self.whole_batch and len(bad) < len(batch) else \
                "no group was usable"
            self._print(f"step {step}: skipped the whole batch ({why}); no update this step")
        return kept

    def _print(self, line: str) -> None:
        if self.report:
            print(f"[grpo] error: {line}", flush=True)

    def summary(self) -> dict[str, Any]:
        """``{"skipped_groups": {reason: n}, "skipped_batches": n}`` for ``summary.json``."""
        return {"skipped_groups": dict(self.groups_by_reason), "skipped_batches": self.batches_skipped}
