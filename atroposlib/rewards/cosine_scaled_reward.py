"""``cosinescaled``: reward semantic similarity to the solution (sentence embeddings).

Not to be confused with ``cosinelength`` (the length-shaped correctness reward of
:mod:`~atroposlib.rewards.cosine_length_reward`): this one embeds the completion and
the reference solution and rewards their cosine similarity. The default embedding model
(``sentence-transformers/all-MiniLM-L6-v2``) must be downloadable or already in the Hugging
Face cache; it is loaded on the first :meth:`CosineScaledReward.compute`, not at import or
construction, and shared by all instances that use the same model.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from atroposlib.rewards.registry import registry
from atroposlib.rewards.reward_function import (
    Completion,
    RewardFunction,
    broadcast,
    get_content,
)

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


#: An embedder maps N texts to N vectors (any sequence of floats; same length for all).
Embedder = Callable[[list[str]], Sequence[Sequence[float]]]

_MODELS: dict[str, Embedder] = {}
_MODELS_LOCK = threading.Lock()


def hf_mean_pooling_embedder(model_name: str) -> Embedder:
    """Embedder of a Hugging Face encoder: mean of the last hidden states over real tokens.

    The mean pooling of Sentence-BERT (Reimers & Gurevych 2019, arXiv:1908.10084). Loads the
    model once per process (CPU, eval mode, no gradients).

    Raises:
        OSError: the model is neither cached nor downloadable (e.g. ``HF_HUB_OFFLINE=1``).
    """
    with _MODELS_LOCK:
        if model_name in _MODELS:
            return _MODELS[model_name]
        import torch
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_name)
        model = AutoModel.from_pretrained(model_name).eval()

        def embed(texts: list[str]) -> list[list[float]]:
            batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
            with torch.no_grad():
                hidden = model(**batch)[0]  # [N, T, H]
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [N, T, 1]
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # [N, H]
            return pooled.tolist()

        _MODELS[model_name] = embed
        return embed


def cosine_similarity(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine of the angle between ``a`` and ``b``; 0.0 when either is the zero vector."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm > 0 else 0.0


@registry.register
class CosineScaledReward(RewardFunction):
    """``clip(1 - scale_factor * (1 - cos(e_completion, e_solution)), min_reward, max_reward)``.

    With ``scale_factor=1`` this is the cosine similarity itself, clipped; a larger factor
    punishes dissimilarity faster. Without a ``solution`` every completion gets
    ``default_reward`` (Atropos 0.4 behaved the same).

    Keywords of :meth:`compute`: ``solution``: reference text(s), one for all or one per
    completion (any shape :func:`get_content` accepts).

    Args:
        model_name: Hugging Face encoder to embed with (default :data:`DEFAULT_MODEL`).
        scale_factor: how fast the reward falls with cosine distance.
        min_reward: lower clip of the reward.
        max_reward: upper clip of the reward.
        default_reward: the reward when no solution is given.
        embedder: a callable ``list[str] -> list[vector]`` to use instead of the model
            (tests, or an embedding server).
        **kwargs: ``weight`` (multiplier) and ``name`` (metric name), passed to
            :class:`RewardFunction`.

    Raises:
        ValueError: ``min_reward > max_reward``.
    """

    def __init__(
        self,
        model_name: str | None = None,
        scale_factor: float = 1.0,
        min_reward: float = -1.0,
        max_reward: float = 1.0,
        default_reward: float = 0.0,
        embedder: Embedder | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if min_reward > max_reward:
            raise ValueError(f"min_reward {min_reward} > max_reward {max_reward}")
        self.model_name = model_name or DEFAULT_MODEL
        self.scale_factor = scale_factor
        self.min_reward = min_reward
        self.max_reward = max_reward
        self.default_reward = default_reward
        self._embedder = embedder

    def compute(self, completions: Sequence[Completion], **kwargs: Any) -> list[float]:
        """Score each completion against ``solution``; see the class docstring."""
        solution = kwargs.get("solution")
        if solution is None or solution == "" or solution == []:
            return [self.default_reward] * len(completions)
        n = len(completions)
        solutions = [get_content(s) for s in broadcast(solution, n, "solution")]
        texts = [get_content(c) for c in completions]
        embed = self._embedder or hf_mean_pooling_embedder(self.model_name)
        vectors = list(embed(texts + solutions))
        scores = []
        for i in range(n):
            similarity = cosine_similarity(vectors[i], vectors[n + i])
            reward = 1.0 - self.scale_factor * (1.0 - similarity)
            scores.append(min(max(reward, self.min_reward), self.max_reward))
        return scores


def cosine_scaled_reward(
    completions: Sequence[Completion], solution: Any = None, **kwargs: Any
) -> list[float]:
    """Atropos 0.4's function form: :class:`CosineScaledReward` built from ``kwargs``, unweighted."""
    return CosineScaledReward(**kwargs).compute(completions, solution=solution)
