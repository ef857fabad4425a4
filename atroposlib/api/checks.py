"""Poison checks: whether a scored group can be trained on by the registered trainer's model.

The wire model (:mod:`atroposlib.api.models`) checks types and shapes. These checks look at the
values, against what the trainer registered (``vocab_size``, ``max_token_len``), and find the
groups that would crash the trainer or train it on garbage:

* a token id or label outside ``[0, vocab_size)`` (labels may also be ``IGNORE_INDEX``);
* a label that differs from its token where the position is trained: the trainer takes its
  targets from the labels (``masks``), so the model would learn a token the sampler never saw;
* an empty sequence, one longer than ``max_token_len``, or one with no trained token (the
  first position is never a target, since targets are shifted by one);
* a score that is not finite or whose magnitude passes :data:`MAX_ABS_SCORE`.

The label checks (a label that is not the token, a sequence with no trained token) hold for
trainers that read ``masks`` as labels, as this package's does: a trainer says so by
registering ``vocab_size``. An Atropos 0.4 trainer (which omits it) gets Atropos 0.4's
acceptance of any mask values (its own tests send 0/1 masks), as it gets no vocabulary check;
before any trainer registers, they apply.

Pure functions on plain lists, so a trainer can run the same check on a batch it fetched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from atroposlib.api.models import IGNORE_INDEX, MAX_ABS_SCORE

__all__ = ["MAX_ABS_SCORE", "GroupProblem", "group_problem"]

#: What a label/token-id disagreement most often means, said in every such refusal.
TOKENIZER_HINT = ("the env's tokenizer probably differs from the trainer's: point the env's "
                  "tokenizer_name at the trainer's model")


@dataclass(frozen=True, slots=True)
class GroupProblem:
    """Why a group cannot be trained on.

    Attributes:
        reason: short machine-readable name (``vocab``, ``label_range``, ``label_mismatch``,
            ``empty_sequence``, ``too_long``, ``no_trained_token``, ``score_out_of_bounds``).
        message: what is wrong (field, sequence, position, value), the likely cause and the fix.
    """

    reason: str
    message: str


def _labels_match_prefix_form(tokens: list[int], labels: list[int]) -> int | None:
    """Fast path for the usual row (``IGNORE_INDEX`` prompt, then the tokens themselves).

    Returns:
        The number of ignored leading positions when the row has that form, else None. The
        comparisons run in C (list equality), so the common case costs no Python loop.
    """
    ignored = labels.count(IGNORE_INDEX)
    if labels[ignored:] != tokens[ignored:]:
        return None
    if ignored and labels[:ignored] != [IGNORE_INDEX] * ignored:
        return None
    return ignored


def _row_problem(i: int, tokens: list[int], labels: list[int], vocab_size: int | None,
                 max_token_len: int | None, check_labels: bool = True) -> GroupProblem | None:
    n = len(tokens)
    if n == 0:
        return GroupProblem("empty_sequence", f"tokens[{i}] is empty: every sequence needs at "
                            "least a prompt token and one trained token")
    if max_token_len is not None and n > max_token_len:
        return GroupProblem("too_long", f"tokens[{i}] has {n} tokens, more than the trainer's "
                            f"max_token_len {max_token_len}: it would be cut and trained on a "
                            "truncated sample. Lower the env's max_token_length to at most "
                            f"{max_token_len}, or raise the trainer's max_token_len")
    low, high = min(tokens), max(tokens)
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        bad = low if low < 0 else high
        return GroupProblem("vocab", f"tokens[{i}][{tokens.index(bad)}] is {bad}, outside "
                            f"the trainer's vocabulary [0, {vocab_size}): {TOKENIZER_HINT}")
    if not check_labels:
        return None
    ignored = _labels_match_prefix_form(tokens, labels)
    if ignored is not None:
        trained = n >= 2 and ignored < n
    else:
        trained = False
        for t, (token, label) in enumerate(zip(tokens, labels, strict=True)):
            if label == IGNORE_INDEX:
                continue
            if label < 0 or (vocab_size is not None and label >= vocab_size):
                return GroupProblem("label_range", f"masks[{i}][{t}] is {label}: a label must "
                                    f"be {IGNORE_INDEX} (not trained) or a token id in "
                                    f"[0, {vocab_size if vocab_size is not None else 'vocab_size'})"
                                    f"; {TOKENIZER_HINT}")
            if label != token:
                return GroupProblem("label_mismatch", f"masks[{i}][{t}] is {label} but "
                                    f"tokens[{i}][{t}] is {token}: at a trained position the "
                                    "label must be the token id itself (the trainer learns the "
                                    f"label, the sampler produced the token; {IGNORE_INDEX} "
                                    f"elsewhere). Labels from another tokenization: "
                                    f"{TOKENIZER_HINT}")
            trained = trained or t >= 1
    if not trained:
        return GroupProblem("no_trained_token", f"masks[{i}] trains no token: every position "
                            f"after the first is {IGNORE_INDEX} (the first is never a target, "
                            "targets are shifted by one), so the sequence teaches nothing. Give "
                            "the completion's positions their token ids in masks, or leave the "
                            "sequence out of the group")
    return None


def group_problem(tokens: Sequence[list[int]], masks: Sequence[list[int]],
                  scores: Sequence[float], *, vocab_size: int | None = None,
                  max_token_len: int | None = None, check_labels: bool = True) -> GroupProblem | None:
    """Return why a group would poison training, or None when it is fit to train on.

    Args:
        tokens: ``[G][T_i]`` token ids (rows are lists, as JSON decodes them).
        masks: ``[G][T_i]`` labels (``IGNORE_INDEX`` or the token id); rows as long as
            ``tokens`` (the wire model checks the shapes first).
        scores: ``[G]`` rewards.
        vocab_size: the trainer's vocabulary size, or None when unknown (ids and labels are
            then only checked to be non-negative).
        max_token_len: the trainer's longest sequence, or None when unknown.
        check_labels: check the labels (``label_range``, ``label_mismatch``,
            ``no_trained_token``); False for a trainer that registered no ``vocab_size``
            (see the module docstring).

    Returns:
        The first problem found, scores first and then sequence by sequence, or None.
    """
    for i, score in enumerate(scores):
        if not math.isfinite(score) or abs(score) > MAX_ABS_SCORE:
            return GroupProblem("score_out_of_bounds", f"scores[{i}] is {score}: scores must be "
                                f"finite with |score| <= {MAX_ABS_SCORE:g}; check the env's "
                                "reward function (GRPO normalises scores per group, so their "
                                "scale does not matter)")
    for i, (row, labels) in enumerate(zip(tokens, masks, strict=True)):
        problem = _row_problem(i, row, labels, vocab_size, max_token_len, check_labels)
        if problem is not None:
            return problem
    return None
