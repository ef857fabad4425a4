"""One prompt's completions from a transformers causal LM: tokens, log-probs and finish reasons."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler (OpenAI / vLLM names and meanings).

    Attributes:
        n: completions of the prompt (>= 1).
        max_tokens: most tokens each completion may generate (>= 1).
        temperature: 0 is greedy (then the ``n`` completions are one, repeated).
        top_p: nucleus mass in (0, 1]; 1 keeps every token.
        top_k: keep the k likeliest tokens; -1 or 0 keeps all (vLLM's -1).
        stop: strings that end a completion; the text returned stops before the string.
        seed: a seed for this request's sampling; None draws from the sampler's own stream.
    """

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Sample:
    """One completion.

    Attributes:
        tokens: the generated token ids ``[T]``, a sampled end-of-sequence token included (as
            vLLM returns them).
        logprobs: ``[T]`` log-probability of each token under the model's own distribution
            (temperature 1, before top-p/top-k: vLLM's ``raw_logprobs``), in nats.
        finish_reason: ``stop`` (an end-of-sequence token or a stop string) or ``length``.
        stop_text: the stop string that ended it, or None.
    """

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    stop_text: str | None = None


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a completion: the generation config's ``eos_token_id`` (int or list) and the tokenizer's."""
    ids: list[int] = []
    for source in (getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                   getattr(tokenizer, "eos_token_id", None)):
        for value in source if isinstance(source, list | tuple) else [source]:
            if value is not None and int(value) not in ids:
                ids.append(int(value))
    return ids


class _RawLogprobs:
    """A logits processor that keeps each sampled token's raw log-probability, then warps.

    transformers runs its own processors before custom ones, so this one is handed the raw
    logits only when generate is given no temperature, top-k or top-p of its own: it applies
    them itself (transformers' own warpers) after reading the raw distribution. It holds one
    step's log-softmax ``[rows, V]`` at a time, not every step's logits (``output_logits``
    would hold ``[T, rows, V]``: 300 MB for 64 rows of 24 tokens at SmolLM2's vocabulary).
    """

    def __init__(self, params: SamplingParams):
        from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        self.warpers: list[Any] = []
        if params.temperature not in (0, 1):
            self.warpers.append(TemperatureLogitsWarper(params.temperature))
        if params.temperature and params.top_k > 0:
            self.warpers.append(TopKLogitsWarper(params.top_k))
        if params.temperature and params.top_p < 1:
            self.warpers.append(TopPLogitsWarper(params.top_p))
        self.last: Any = None  # log-softmax of the step before, [rows, V]
        self.logprobs: list[Any] = []  # [rows] per generated token

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.take(input_ids[:, -1])
        import torch

        self.last = torch.log_softmax(scores.float(), dim=-1)
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        return scores

    def take(self, chosen: Any) -> None:
        """Record the log-probs of the tokens ``chosen`` ``[rows]`` from the step before."""
        if self.last is not None:
            self.logprobs.append(self.last.gather(-1, chosen.unsqueeze(-1)).squeeze(-1))
            self.last = None


def sample_batch(model: Any, tokenizer: Any, prompts: list[list[int]], params: list[SamplingParams],
                 eos_ids: list[int]) -> list[list[Sample]]:
    """Generate every request's completions in one ``model.generate`` call.

    The requests must share ``temperature``, ``top_p`` and ``top_k`` (and no ``seed``: the
    caller owns the RNG); ``n`` and ``max_tokens`` may differ. Prompts are left-padded into
    one batch of ``sum(n)`` rows (one row for a greedy request, repeated ``n`` times). Each row
    runs to the largest ``max_tokens`` and is then cut to its own: for autoregressive sampling
    that is the same as stopping it there.

    The caller owns the model's mode: call it under ``torch.inference_mode`` with the model
    in eval mode (under gradient checkpointing, train mode turns the KV cache off).

    Args:
        model: a transformers causal LM (peft-wrapped models too).
        tokenizer: its tokenizer (decodes for stop strings).
        prompts: each request's prompt token ids ``[P_i]``, P_i >= 1.
        params: each request's sampling settings.
        eos_ids: ids that end a completion (:func:`eos_token_ids`); may be empty.

    Returns:
        Per request, its ``n`` samples in order.
    """
    import torch
    from transformers import GenerationConfig

    first = params[0]
    greedy = first.temperature == 0
    rows_of = [1 if greedy else p.n for p in params]
    rows = [prompt for prompt, k in zip(prompts, rows_of, strict=True) for _ in range(k)]
    width = max(len(r) for r in rows)
    pad = eos_ids[0] if eos_ids else 0
    device = next(model.parameters()).device
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long,
                        device=device)
    recorder = _RawLogprobs(first)
    # a fresh config: no sampling default of the model's generation_config applies
    neutral = dict(temperature=None, top_k=None, top_p=None) if greedy else \
        dict(temperature=1.0, top_k=0, top_p=1.0)  # the recorder warps, after reading raw logits
    config = GenerationConfig(max_new_tokens=max(p.max_tokens for p in params), do_sample=not greedy,
                              eos_token_id=eos_ids or None, pad_token_id=pad,
                              return_dict_in_generate=True, **neutral)
    out = model.generate(input_ids=input_ids, attention_mask=mask, generation_config=config,
                         logits_processor=[recorder])
    generated = out.sequences[:, width:]  # [rows, T]
    if generated.shape[1]:
        recorder.take(generated[:, -1])
        logprobs = torch.stack(recorder.logprobs, dim=1)  # [rows, T]
    else:
        logprobs = generated.float()
    samples, row = [], 0
    for p, k in zip(params, rows_of, strict=True):
        mine = [_finish(generated[r, :p.max_tokens].tolist(), logprobs[r, :p.max_tokens].tolist(), p,
                        eos_ids, tokenizer) for r in range(row, row + k)]
        samples.append(mine * p.n if greedy else mine)
        row += k
    return samples


def _finish(tokens: list[int], logprobs: list[float], params: SamplingParams, eos_ids: list[int],
            tokenizer: Any) -> Sample:
    """Cut one generated row where it ended (EOS, stop string) and name why."""
    end = next((i for i, t in enumerate(tokens) if t in eos_ids), None)
    if params.stop:  # the first token after which a stop string appears in the text
        limit = len(tokens) if end is None else end
        for i in range(1, limit + 1):
            text = tokenizer.decode(tokens[:i], skip_special_tokens=True)
            hit = next((s for s in params.stop if s in text), None)
            if hit is not None:
                return Sample(tokens[:i], logprobs[:i], "stop", hit)
    if end is not None:
        return Sample(tokens[:end + 1], logprobs[:end + 1], "stop")
    return Sample(tokens, logprobs, "length" if len(tokens) >= params.max_tokens else "stop")


def completion_text(tokenizer: Any, done: Sample) -> str:
    """The completion's text as vLLM returns it: special tokens skipped, cut before its stop string."""
    text = tokenizer.decode(done.tokens, skip_special_tokens=True)
    if done.stop_text is not None:
        text = text[:text.find(done.stop_text)]
    return text


__all__ = ["Sample", "SamplingParams", "completion_text", "eos_token_ids", "sample_batch"]
