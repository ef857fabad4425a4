"""The policy being trained: loading it, freezing layers, its logits, and the model + optimizer of a run.

:func:`load_training_policy` builds what one run trains (model with LoRA or frozen layers,
sharded under FSDP, resumed weights and optimizer state); the functions below it are the
pieces, also used by tests and benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Policy:
    """What a run trains.

    Attributes:
        model: the causal LM (peft-wrapped with LoRA, FSDP-sharded under torchrun).
        tokenizer: its tokenizer.
        optimizer: AdamW over ``trainable`` (``--optim``: fp32 or 8-bit moments).
        trainable: the parameters with ``requires_grad``.
        start_step: the step the run resumes after (0 for a new run).
        vocab_size: embedding rows; token ids at or above it would crash the forward.
        load_device: where models are loaded (CPU under FSDP, which moves each shard).
        dtype: the weights' torch dtype.
    """

    model: Any
    tokenizer: Any
    optimizer: Any
    trainable: list[Any]
    start_step: int
    vocab_size: int
    load_device: Any
    dtype: Any


def load_training_policy(config: Any, dist: Any, resume: Any, device: Any) -> Policy:
    """Load the model, apply LoRA or freeze layers, shard it, resume it, and build the optimizer.

    Args:
        config: the :class:`~example_trainer.config.TrainerConfig`.
        dist: the run's :class:`~example_trainer.distributed.Dist` (single process or FSDP).
        resume: the checkpoint to resume from (:func:`~example_trainer.checkpoint.require_checkpoint`), or None.
        device: the torch device to train on.

    Raises:
        ValueError: ``train_last_layers`` exceeds the model's decoder layers.
    """
    import torch

    from example_trainer import checkpoint as ckpt_io
    from example_trainer import lora
    from example_trainer.optimizer import build_optimizer

    torch.manual_seed(config.seed)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(
        config.dtype, torch.bfloat16 if device.type == "cuda" else torch.float32)
    # sharded: every rank loads on the CPU and FSDP moves its own shard to the device
    load_device = torch.device("cpu") if dist.enabled else device
    model, tokenizer = load_policy(config.model, load_device, dtype, config.attn_implementation)
    vocab_size = model.get_input_embeddings().num_embeddings  # ids at or above it crash the forward
    if config.lora_r:
        model = lora.apply_lora(model, r=config.lora_r, alpha=config.lora_alpha,
                                dropout=config.lora_dropout, target_modules=config.lora_target_modules,
                                last_layers=config.train_last_layers)
    elif config.train_last_layers:
        freeze_all_but_last_layers(model, config.train_last_layers)
    if config.gradient_checkpointing:
        from example_trainer.checkpointing import enable_checkpointing

        # non-reentrant, so LoRA adapters get gradients without making the (frozen) input
        # embeddings' output require grad, which would drag backward through frozen layers
        enable_checkpointing(model, config.gradient_checkpointing_mode)
    # with LoRA every base Linear is frozen, the top layers' too: all of them go to bf16
    if config.mixed_precision == "bf16" and not dist.enabled:
        from example_trainer.memory import compact_frozen_linears, round_frozen_embeddings

        if config.round_frozen_embeddings:  # before: compact_frozen_linears skips a shared table
            round_frozen_embeddings(model, torch.bfloat16)
        compact_frozen_linears(model, torch.bfloat16)  # frozen Linears in bf16: exact under autocast
    if resume is not None and resume.lora:  # before sharding: FSDP shards the loaded adapter
        lora.load_adapter(model, resume.adapter_dir)
    model = dist.shard(model)
    if resume is not None and not resume.lora:
        ckpt_io.load_full_weights(model, resume)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    if dist.is_main:
        print(f"[grpo] training {_numel(trainable) / 1e6:.1f}M of {_numel(model.parameters()) / 1e6:.1f}M "
              f"parameters on {device}" + (f" x {dist.world_size} ranks (FSDP)" if dist.enabled else ""),
              flush=True)
    optimizer = build_optimizer(config.optim, trainable, lr=config.lr, betas=config.adam_betas,
                                weight_decay=config.weight_decay, sharded=dist.enabled)
    start_step = 0
    if resume is not None:
        start_step = ckpt_io.load_training_state(model, optimizer, resume)
        if dist.is_main:
            print(f"[grpo] resuming from {resume.path} after step {start_step}", flush=True)
    return Policy(model, tokenizer, optimizer, trainable, start_step, vocab_size, load_device, dtype)


def load_policy(model_dir: str, device: Any, dtype: Any, attn_implementation: str | None) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer for training.

    Args:
        model_dir: HF model directory or hub id.
        device: torch device.
        dtype: torch dtype of the weights.
        attn_implementation: HF attention kernel; None = eager on CPU, sdpa on CUDA.

    Returns:
        ``(model, tokenizer)``.
    """
    from transformers import AutoModelForCausalLM

    from atroposlib.utils.hf_tokenizer import load_tokenizer

    attn = attn_implementation or ("sdpa" if device.type == "cuda" else "eager")
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn)
    return model.to(device), tokenizer


def policy_logits(model: Any, mb: Any, keep: int, autocast: Any, shared_prefix: bool = False) -> Any:
    """Next-token logits of a micro-batch, in the dtype the model produced them.

    Under bf16 autocast that is bf16: :func:`~example_trainer.logprobs.token_logprobs` computes in
    float32 a block of rows at a time, so no float32 ``[B, T, V]`` copy is made (on the
    quickstart a copy and its gradient were 0.1 GiB of a step's peak).

    Args:
        model: the policy (or reference) causal LM.
        mb: a :class:`~example_trainer.data.MicroBatch` (``[B, T]`` inputs).
        keep: 0 for every position, else the last ``keep`` only (``logits_to_keep``; pass the
            micro-batch returned by :meth:`~example_trainer.data.MicroBatch.trained_tail`).
        autocast: a ``torch.autocast`` context (disabled for full precision).
        shared_prefix: run each prompt shared by several rows once
            (:func:`~example_trainer.shared_prefix.shared_prefix_logits`; the logits of
            untrained positions are then 0).

    Returns:
        ``[B, T or keep, V]`` logits (float32 from the shared-prefix forward).
    """
    if shared_prefix:
        from example_trainer.shared_prefix import shared_prefix_logits

        return shared_prefix_logits(model, mb, keep, autocast)
    with autocast:  # use_cache=False: a training forward builds no KV cache it never reads
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False,
                    **({"logits_to_keep": keep} if keep else {}))
    return out.logits


def accepts_logits_to_keep(model: Any) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` (HF causal LMs since transformers 4.50).

    Looks through wrappers (peft's ``get_base_model``); FSDP2 keeps the module's own class.
    """
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(type(base).forward).parameters


def freeze_all_but_last_layers(model: Any, n: int) -> None:
    """Leave only the last ``n`` decoder layers and the final norm trainable.

    Works for HF decoder-only models that keep their blocks in ``model.model.layers`` (Llama,
    Qwen, Mistral, SmolLM ...). Embeddings (and a tied LM head) stay frozen.

    Raises:
        ValueError: the model has no ``model.layers`` list, or fewer than ``n`` layers.
    """
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or n > len(layers):
        raise ValueError(
            f"train_last_layers={n}: the model has {'no model.layers' if layers is None else len(layers)}"
            " decoder layers; lower it or leave it unset to train everything")
    model.requires_grad_(False)
    for layer in layers[len(layers) - n:]:
        layer.requires_grad_(True)
    norm = getattr(model.model, "norm", None)
    if norm is not None:
        norm.requires_grad_(True)


def _numel(params: Any) -> int:
    return sum(p.numel() for p in params)


__all__ = ["Policy", "accepts_logits_to_keep", "freeze_all_but_last_layers", "load_policy",
           "load_training_policy", "policy_logits"]
