"""A tiny, offline, byte-level HF tokenizer with a ChatML chat template, for fast tests.

Real ``transformers.PreTrainedTokenizerFast`` (``tokenizers`` byte-level BPE with no merges:
one token per byte, plus ``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``), so chat
templates, encode/decode and special tokens behave like a real model's tokenizer without the
hub or a model download. Use the bundled SmolLM2 tokenizer where real vocabulary matters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: ChatML template (same turn format as SmolLM2-Instruct).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def make_tiny_tokenizer(save_dir: str | Path | None = None) -> Any:
    """Build the tiny tokenizer (vocab 259: 256 bytes + 3 specials; EOS = ``<|im_end|>``).

    Args:
        save_dir: when given, also ``save_pretrained`` there so ``AutoTokenizer`` (and
            ``--env.tokenizer_name DIR``) can load it.

    Returns:
        A ``transformers.PreTrainedTokenizerFast``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_vocab = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_vocab))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    if save_dir is not None:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(str(save_dir))
    return tokenizer


__all__ = ["CHATML_TEMPLATE", "make_tiny_tokenizer"]
