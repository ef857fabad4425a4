"""Size a vLLM on CPU to its work: the KV cache and the concurrent sequences a training run needs.

vLLM on CPU allocates (and zero-fills, so it is resident) a KV cache of a fixed size at start:
``VLLM_CPU_KVCACHE_SPACE`` GiB, or ``--kv-cache-memory-bytes``. A GRPO run on a small model
needs far less than the usual 2 GiB: the quickstart keeps at most 8 groups of 8 rollouts in
flight, each at most ``max_token_len`` (256) tokens long, and SmolLM2-135M stores
``2 (K and V) x 30 layers x 3 KV heads x 64 dims x 2 bytes`` = 23 KB per token in bf16, so
64 sequences of 256 tokens take 0.35 GiB.

:func:`kv_bytes_per_token` reads the model's ``config.json``; :func:`kv_cache_bytes` turns a
workload (sequences at once, tokens each) into the cache size in whole blocks;
:func:`size_for_training` applies the trainer's defaults. Nothing here imports torch or vLLM.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

#: Batches of sequences a training run keeps in flight at most, by default: the envs sample up to
#: ``max_batches_offpolicy`` (2-3) batches ahead, counting a rollout by its recent yield, and
#: their ``max_num_workers`` (8 groups per server) bounds it; 4 batches cover both.
DEFAULT_INFLIGHT_BATCHES = 4
#: The most concurrent sequences chosen automatically (vLLM's own CPU default is 128 per server).
MAX_AUTO_NUM_SEQS = 256
#: The largest automatic KV cache on CPU, in GiB (vLLM's usual ``VLLM_CPU_KVCACHE_SPACE``); a
#: workload that would need more gets this, and vLLM queues or preempts the excess.
MAX_AUTO_KV_CACHE_GIB = 2.0

_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def kv_bytes_per_token(model_dir: str | Path, dtype: str) -> int:
    """Bytes of KV cache one token takes: ``2 x layers x KV heads x head_dim x dtype bytes``.

    Args:
        model_dir: a Hugging Face model directory (its ``config.json`` is read; a
            ``text_config`` inside it is used for multimodal models).
        dtype: the KV cache dtype, which vLLM takes from the model's (``float32``,
            ``bfloat16``, ``float16``).

    Raises:
        FileNotFoundError: ``model_dir`` has no ``config.json``.
        ValueError: an unknown dtype, or a config without ``num_hidden_layers`` /
            ``num_attention_heads``.
    """
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"unknown KV cache dtype {dtype!r}; use one of {sorted(_DTYPE_BYTES)}")
    config = json.loads((Path(model_dir) / "config.json").read_text())
    config = config.get("text_config", config)
    try:
        layers, heads = int(config["num_hidden_layers"]), int(config["num_attention_heads"])
    except KeyError as exc:
        raise ValueError(f"{model_dir}/config.json has no {exc}: cannot size its KV cache; set "
                         "the KV cache size explicitly") from exc
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return 2 * layers * kv_heads * head_dim * _DTYPE_BYTES[dtype]


def kv_cache_bytes(per_token: int, num_seqs: int, tokens_per_seq: int, max_model_len: int,
                   block_size: int) -> int:
    """KV cache bytes for ``num_seqs`` sequences of up to ``tokens_per_seq`` tokens at once.

    Whole blocks per sequence, one more block (vLLM keeps block 0 as a null block), and never
    less than one ``max_model_len`` request (vLLM refuses to start otherwise).

    Args:
        per_token: :func:`kv_bytes_per_token`.
        num_seqs: sequences running at once (``--max-num-seqs``).
        tokens_per_seq: the longest sequence (prompt + completion) in tokens.
        max_model_len: vLLM's context length.
        block_size: vLLM's KV block size in tokens.

    Raises:
        ValueError: an argument below 1.
    """
    if min(per_token, num_seqs, tokens_per_seq, max_model_len, block_size) < 1:
        raise ValueError("per_token, num_seqs, tokens_per_seq, max_model_len and block_size "
                         "must all be >= 1")
    blocks = max(num_seqs * math.ceil(tokens_per_seq / block_size),
                 math.ceil(max_model_len / block_size)) + 1
    return blocks * block_size * per_token


@dataclass(frozen=True)
class VLLMSizing:
    """The vLLM settings a training run asks for.

    Attributes:
        max_num_seqs: ``--max-num-seqs``.
        kv_cache_bytes: ``--kv-cache-memory-bytes`` (CPU only); None: vLLM's setting
            (``VLLM_CPU_KVCACHE_SPACE``).
    """

    max_num_seqs: int
    kv_cache_bytes: int | None


def size_for_training(model_dir: str | Path, kv_dtype: str, batch_size: int, max_token_len: int,
                      max_model_len: int, block_size: int, max_num_seqs: int | None = None,
                      kv_cache_gib: float | None = None) -> VLLMSizing:
    """The vLLM sizing of a training run whose batches have ``batch_size`` sequences.

    Args:
        model_dir: the served model's directory (for :func:`kv_bytes_per_token`).
        kv_dtype: the served dtype (``float32`` / ``bfloat16`` / ``float16``).
        batch_size: sequences per trainer step.
        max_token_len: the longest sequence the trainer accepts (longer groups are dropped).
        max_model_len: vLLM's context length.
        block_size: vLLM's KV block size in tokens.
        max_num_seqs: None: ``DEFAULT_INFLIGHT_BATCHES x batch_size``, at most
            ``MAX_AUTO_NUM_SEQS``.
        kv_cache_gib: None: :func:`kv_cache_bytes` of ``max_num_seqs`` sequences of
            ``min(max_token_len, max_model_len)`` tokens, at most ``MAX_AUTO_KV_CACHE_GIB``;
            when ``model_dir`` is not a local directory with a ``config.json`` (a hub id) the
            size is left to vLLM (``kv_cache_bytes`` None).

    Raises:
        ValueError: the model's config lacks what the KV size needs (set ``kv_cache_gib``).
    """
    seqs = max_num_seqs or min(MAX_AUTO_NUM_SEQS, DEFAULT_INFLIGHT_BATCHES * batch_size)
    if kv_cache_gib is not None:
        return VLLMSizing(seqs, int(kv_cache_gib * 2**30))
    try:
        per_token = kv_bytes_per_token(model_dir, kv_dtype)
    except FileNotFoundError:
        return VLLMSizing(seqs, None)
    needed = kv_cache_bytes(per_token, seqs, min(max_token_len, max_model_len), max_model_len,
                            block_size)
    return VLLMSizing(seqs, min(needed, int(MAX_AUTO_KV_CACHE_GIB * 2**30)))


__all__ = ["DEFAULT_INFLIGHT_BATCHES", "MAX_AUTO_KV_CACHE_GIB", "MAX_AUTO_NUM_SEQS", "VLLMSizing",
           "kv_bytes_per_token", "kv_cache_bytes", "size_for_training"]
