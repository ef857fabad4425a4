"""Turn one ``GET /batch`` (a list of scored groups) into padded, shifted training tensors.

Wire conventions: ``tokens[i]`` is prompt + completion; ``masks[i]`` holds -100 where
not trained and the token id where trained; ``inference_logprobs[i]`` holds 1.0 at masked
positions and the sampler's log-prob at generated ones; ``advantages[i]`` (optional) is
per-token. Position ``t`` of the model input predicts token ``t + 1``, so every per-token field
is shifted by one: ``input = tokens[:-1]``, ``labels = masks[1:]``, ``old = logprobs[1:]``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from atroposlib.api.models import IGNORE_INDEX

if TYPE_CHECKING:
    import torch


def group_advantages(scores: Sequence[float], eps: float = 1e-8, scale: bool = True) -> list[float]:
    """GRPO outcome advantages: scores standardised within their group.

    ``A_i = (s_i - mean(s)) / max(std(s), eps)`` with the population std (Shao et al. 2024,
    arXiv:2402.03300, section 4.1.2). A group of one sequence keeps its raw score (as Atropos
    0.4); a group whose scores are all equal gets zeros. With ``scale=False`` the division by the
    std is left out, ``A_i = s_i - mean(s)``: Dr. GRPO (Liu et al. 2025, arXiv:2503.20783) shows
    the std scaling weights low-variance (too easy or too hard) questions up.

    Args:
        scores: ``[G]`` rewards of one group.
        eps: floor for the std.
        scale: divide by the group's std.

    Returns:
        ``[G]`` advantages.
    """
    n = len(scores)
    if n == 0:
        return []
    if n == 1:
        return [float(scores[0])]
    mean = sum(scores) / n
    if not scale:
        return [s - mean for s in scores]
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / n)
    return [(s - mean) / max(std, eps) for s in scores]


def sequence_temperature(group: dict[str, Any], i: int) -> float:
    """Sampling temperature of sequence ``i``: overrides > generation_params > group_overrides > 1.

    Args:
        group: one scored group (wire dict).
        i: sequence index in the group.

    Returns:
        The temperature (a positive float; non-positive or missing values give 1.0).
    """
    candidates = []
    overrides = group.get("overrides") or []
    if i < len(overrides) and overrides[i]:
        candidates.append(overrides[i].get("temperature"))
    candidates.append((group.get("generation_params") or {}).get("temperature"))
    candidates.append((group.get("group_overrides") or {}).get("temperature"))
    for value in candidates:
        if value is not None:
            value = float(value)
            return value if value > 0 else 1.0
    return 1.0


@dataclass
class TrainSequence:
    """One training sequence, unpadded and already shifted (length ``T_i - 1``).

    Attributes:
        input_ids: model input ids.
        labels: target ids, -100 where not trained.
        advantages: per-target advantage.
        sampler_logprobs: the sampler's (behaviour policy's) log-prob per target, ``nan``
            where unknown (the wire's ``inference_logprobs``, shifted).
        ref_logprobs: reference log-prob per target, or None.
        temperature: sampling temperature.
        score: the sequence's reward (for logging).
        distill_token_ids: per target, the teacher's top-K candidate ids (``[T_i - 1][K_t]``,
            shifted like ``labels``), or None when the group carried no teacher arrays.
        distill_logprobs: the teacher's log-probs of those candidates, same shape, or None.
    """

    input_ids: list[int]
    labels: list[int]
    advantages: list[float]
    sampler_logprobs: list[float]
    ref_logprobs: list[float] | None
    temperature: float
    score: float
    distill_token_ids: list[list[int]] | None = None
    distill_logprobs: list[list[float]] | None = None


@dataclass
class MicroBatch:
    """Padded tensors of up to ``micro_batch_size`` sequences (``T`` a multiple of ``pad_multiple``).

    Attributes:
        input_ids: ``[B, T]`` long, padded with ``pad_token_id``.
        attention_mask: ``[B, T]`` long, 1 on real tokens.
        labels: ``[B, T]`` long, -100 on prompt and padding.
        advantages: ``[B, T]`` float32.
        sampler_logprobs: ``[B, T]`` float32, ``nan`` where the sampler log-prob is unknown.
        ref_logprobs: ``[B, T]`` float32 (``nan`` where unknown) or None when no sequence
            carried them.
        temperatures: ``[B]`` float32 (None: 1 for every sequence; the trainer's step drops an
            all-ones tensor so that no device-side check waits for the GPU).
        distill_token_ids: ``[B, T, K]`` long teacher candidate ids (0 where padded), or None
            when no sequence carried teacher arrays; ``K`` = widest position in the micro-batch.
        distill_logprobs: ``[B, T, K]`` float32 teacher log-probs, ``-inf`` where padded.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    advantages: torch.Tensor
    sampler_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    temperatures: torch.Tensor | None
    distill_token_ids: torch.Tensor | None = None
    distill_logprobs: torch.Tensor | None = None

    def trained_tail(self) -> tuple[int, MicroBatch]:
        """The positions from the first trained token to the end, for ``logits_to_keep``.

        Prompt positions carry no loss, so the LM head (a ``[T, V]`` projection, the largest
        single matmul of a small model) and the log-softmax need only run on the tail that holds
        every completion: pass ``keep`` to the model as ``logits_to_keep`` and use the returned
        copy, whose per-token tensors are cut to the same last ``keep`` positions
        (``input_ids`` and ``attention_mask`` stay whole: the model still reads the prompt).

        Returns:
            ``(keep, tail)``: ``keep`` in ``[1, T]``; ``tail`` with ``[B, keep]`` labels,
            advantages and log-probs (``[B, keep, K]`` distillation arrays).
        """
        trained = (self.labels != IGNORE_INDEX).any(dim=0).nonzero()
        first = int(trained[0]) if len(trained) else self.labels.shape[1] - 1
        keep = self.labels.shape[1] - first
        cut = {name: (value[:, first:] if value is not None and value.dim() > 1
                      and name not in ("input_ids", "attention_mask") else value)
               for name, value in self.__dict__.items()}
        return keep, MicroBatch(**cut)

    def staged(self, device: Any, tail: bool) -> tuple[int, MicroBatch]:
        """The micro-batch as a training step uses it: what needs the CPU is done here, once.

        On a GPU every read of a device value (a ``nonzero``, a ``bool`` of a comparison) waits
        for all queued work, so a step stages every micro-batch before its first forward: the
        trained tail is found on the CPU copy (:meth:`trained_tail`), an all-ones temperature
        tensor is dropped (a division by 1 would change nothing, and checking it on the device
        would wait), and the tensors are moved to ``device``.

        Args:
            device: where the forward runs.
            tail: cut to the trained tail (a model that accepts ``logits_to_keep``); False
                keeps every position and returns ``keep`` 0 (the LM head runs everywhere).

        Returns:
            ``(keep, micro_batch)``: ``keep`` for ``logits_to_keep`` (0: all positions) and a
            copy on ``device``, with ``temperatures`` None when every one is 1 (or <= 0, read
            as 1).
        """
        keep, mb = self.trained_tail() if tail else (0, self)
        temps = mb.temperatures
        if temps is not None and bool(((temps == 1) | (temps <= 0)).all()):
            mb = replace(mb, temperatures=None)
        return keep, mb.to(device)

    def to(self, device: Any) -> MicroBatch:
        """Return a copy with every tensor moved to ``device``."""
        moved = {
            name: (value.to(device) if value is not None else None)
            for name, value in self.__dict__.items()
        }
        return MicroBatch(**moved)


@dataclass
class BatchStats:
    """Statistics of a batch before padding (for logging).

    Attributes:
        num_sequences: sequences in the batch.
        num_groups: groups in the batch.
        scores: every sequence's reward.
        advantages: every sequence's (mean) advantage.
        has_inference_logprobs: how many sequences carried sampler log-probs.
        max_len: longest sequence in tokens.
        excluded: members the groups' envs kept out of training (the wire's ``excluded``
            list), counted by ``"failed/<kind>"`` or ``"masked/<reason>"``; they are not
            sequences of the batch and count in no advantage.
    """

    num_sequences: int = 0
    num_groups: int = 0
    scores: list[float] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    has_inference_logprobs: int = 0
    max_len: int = 0
    excluded: dict[str, int] = field(default_factory=dict)


def batch_to_sequences(groups: Sequence[dict[str, Any]],
                       scale_advantages: bool = True) -> tuple[list[TrainSequence], BatchStats]:
    """Compute advantages and shift every sequence of a ``/batch`` into a :class:`TrainSequence`.

    Advantages: the env's per-token ``advantages`` when the group carries them, else
    :func:`group_advantages` of the group's ``scores``. Only the group's completed members are
    in its lists; masked and failed members (its ``excluded`` list, an atroposlib extension)
    are counted in ``stats.excluded`` and nowhere else, so the advantages of a group with
    exclusions equal, bit for bit, those of a clean group made of its completed members. ``overrides[i].set_advantage_to_zero``
    zeroes sequence ``i``'s advantage. Teacher arrays (``distill_token_ids`` /
    ``distill_logprobs``, ``[G][T_i][K]``, position t holding the candidates for token t) are
    shifted like the labels, so target j gets position j + 1.

    Args:
        groups: the list returned by ``GET /batch`` (wire dicts), checked by
            :mod:`example_trainer.batch_checks` first (nothing is truncated here).
        scale_advantages: divide score advantages by the group's std (``scale`` of
            :func:`group_advantages`); env-sent per-token advantages are used as sent.

    Returns:
        ``(sequences, stats)``.

    Raises:
        ValueError: a group's rows disagree in length (message names the field).
    """
    sequences: list[TrainSequence] = []
    stats = BatchStats(num_groups=len(groups))
    for g, group in enumerate(groups):
        tokens, masks, scores = group["tokens"], group["masks"], group["scores"]
        if not (len(tokens) == len(masks) == len(scores)):
            raise ValueError(
                f"group {g}: tokens/masks/scores have {len(tokens)}/{len(masks)}/{len(scores)} "
                "rows; every group needs one row per sequence"
            )
        for member in group.get("excluded") or ():
            key = f"{member.get('outcome')}/{member.get('kind') or member.get('reason')}"
            stats.excluded[key] = stats.excluded.get(key, 0) + 1
        seq_adv = group_advantages(scores, scale=scale_advantages)
        token_adv = group.get("advantages")
        sampler_lps = group.get("inference_logprobs")
        ref_lps = group.get("ref_logprobs")
        overrides = group.get("overrides") or []
        d_ids, d_lps = group.get("distill_token_ids"), group.get("distill_logprobs")
        for i, (toks, mask) in enumerate(zip(tokens, masks, strict=True)):
            if len(toks) != len(mask):
                raise ValueError(f"group {g} sequence {i}: tokens has {len(toks)} entries but masks has {len(mask)}")
            n = len(toks)
            zero = bool(i < len(overrides) and overrides[i] and overrides[i].get("set_advantage_to_zero"))
            if token_adv is not None and token_adv[i] is not None:
                adv = [float(a) for a in token_adv[i][1:n]]
            else:
                adv = [seq_adv[i]] * (n - 1)
            if zero:
                adv = [0.0] * (n - 1)
            if sampler_lps is not None and sampler_lps[i] is not None:
                old = [float(v) for v in sampler_lps[i][1:n]]
                # 1.0 is the wire placeholder for "no sampler log-prob here".
                old = [v if v <= 0.0 else math.nan for v in old]
                stats.has_inference_logprobs += 1
            else:
                old = [math.nan] * (n - 1)
            ref = [float(v) for v in ref_lps[i][1:n]] if ref_lps is not None and ref_lps[i] is not None else None
            dist_ids = dist_lps = None
            if d_ids is not None and d_lps is not None and d_ids[i] is not None and d_lps[i] is not None:
                dist_ids = [[int(t) for t in pos] for pos in d_ids[i][1:n]]
                dist_lps = [[float(v) for v in pos] for pos in d_lps[i][1:n]]
            sequences.append(
                TrainSequence(
                    input_ids=list(toks[:-1]),
                    labels=list(mask[1:]),
                    advantages=adv,
                    sampler_logprobs=old,
                    ref_logprobs=ref,
                    temperature=sequence_temperature(group, i),
                    score=float(scores[i]),
                    distill_token_ids=dist_ids,
                    distill_logprobs=dist_lps,
                )
            )
            stats.scores.append(float(scores[i]))
            stats.advantages.append(sum(adv) / max(len(adv), 1))
            stats.max_len = max(stats.max_len, n)
    stats.num_sequences = len(sequences)
    return sequences, stats


def padded_length(length: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``length`` (and >= ``multiple``)."""
    if multiple < 1:
        raise ValueError(f"pad multiple must be >= 1, got {multiple}")
    return max(multiple, -(-length // multiple) * multiple)


def collate(sequences: Sequence[TrainSequence], pad_token_id: int = 0, pad_multiple: int = 32) -> MicroBatch:
    """Right-pad sequences to a common length that is a multiple of ``pad_multiple``.

    Padding: ``input_ids`` with ``pad_token_id``, ``labels`` with -100, advantages with 0,
    log-probs with ``nan`` (unknown), teacher candidates with id 0 and log-prob ``-inf``;
    ``attention_mask`` is 0 on padding.

    Args:
        sequences: shifted sequences from :func:`batch_to_sequences` (at least one).
        pad_token_id: id used for padding inputs (masked out by ``attention_mask``).
        pad_multiple: the padded length ``T`` is a multiple of this.

    Returns:
        A :class:`MicroBatch` with ``B = len(sequences)``.

    Raises:
        ValueError: ``sequences`` is empty.
    """
    import torch

    if not sequences:
        raise ValueError("collate needs at least one sequence")
    T = padded_length(max(len(s.input_ids) for s in sequences), pad_multiple)
    B = len(sequences)
    input_ids = torch.full((B, T), pad_token_id, dtype=torch.long)
    attention = torch.zeros((B, T), dtype=torch.long)
    labels = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
    adv = torch.zeros((B, T), dtype=torch.float32)
    old = torch.full((B, T), math.nan, dtype=torch.float32)
    any_ref = any(s.ref_logprobs is not None for s in sequences)
    ref = torch.full((B, T), math.nan, dtype=torch.float32) if any_ref else None
    for b, s in enumerate(sequences):
        n = len(s.input_ids)
        input_ids[b, :n] = torch.tensor(s.input_ids, dtype=torch.long)
        attention[b, :n] = 1
        labels[b, :n] = torch.tensor(s.labels, dtype=torch.long)
        adv[b, :n] = torch.tensor(s.advantages, dtype=torch.float32)
        old[b, :n] = torch.tensor(s.sampler_logprobs, dtype=torch.float32)
        if ref is not None and s.ref_logprobs is not None:
            ref[b, :n] = torch.tensor(s.ref_logprobs, dtype=torch.float32)
    temps = torch.tensor([s.temperature for s in sequences], dtype=torch.float32)
    k = max((len(pos) for s in sequences for pos in (s.distill_token_ids or [])), default=0)
    d_ids = d_lps = None
    if k:
        d_ids = torch.zeros((B, T, k), dtype=torch.long)
        d_lps = torch.full((B, T, k), -math.inf, dtype=torch.float32)
        for b, s in enumerate(sequences):
            if s.distill_token_ids is None or s.distill_logprobs is None:
                continue
            n = len(s.distill_token_ids)
            d_ids[b, :n] = torch.tensor([ids + [0] * (k - len(ids)) for ids in s.distill_token_ids],
                                        dtype=torch.long).reshape(n, k)
            d_lps[b, :n] = torch.tensor(
                [lps + [-math.inf] * (k - len(lps)) for lps in s.distill_logprobs],
                dtype=torch.float32).reshape(n, k)
    return MicroBatch(input_ids, attention, labels, adv, old, ref, temps, d_ids, d_lps)


def make_micro_batches(
    sequences: Sequence[TrainSequence],
    micro_batch_size: int,
    pad_token_id: int = 0,
    pad_multiple: int = 32,
    by_prefix: bool = False,
) -> list[MicroBatch]:
    """Split sequences into padded micro-batches, grouping similar lengths to waste less padding.

    Args:
        sequences: the step's sequences.
        micro_batch_size: sequences per forward/backward pass (>= 1).
        pad_token_id: padding id for inputs.
        pad_multiple: each micro-batch's length is a multiple of this.
        by_prefix: order by untrained prefix first (then length), so that the rollouts of a
            group, which share their prompt, land in the same micro-batch (for the shared-prefix
            forward); larger groups come first, so groups of ``micro_batch_size / k`` rows each
            fill micro-batches without being split.

    Returns:
        ``ceil(len(sequences) / micro_batch_size)`` micro-batches covering every sequence once.

    Raises:
        ValueError: ``micro_batch_size`` < 1.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    def prefix(seq: TrainSequence) -> list[int]:
        first = next((j for j, label in enumerate(seq.labels) if label != IGNORE_INDEX), len(seq.labels))
        return seq.input_ids[:first]

    if by_prefix:  # largest groups first, so groups of equal size fill micro-batches whole
        prefixes = [tuple(prefix(seq)) for seq in sequences]
        size = Counter(prefixes)
        order = sorted(range(len(sequences)),
                       key=lambda k: (-size[prefixes[k]], prefixes[k], len(sequences[k].input_ids)))
    else:
        order = sorted(range(len(sequences)), key=lambda k: len(sequences[k].input_ids))
    ordered = [sequences[k] for k in order]
    return [
        collate(ordered[start : start + micro_batch_size], pad_token_id, pad_multiple)
        for start in range(0, len(ordered), micro_batch_size)
    ]
