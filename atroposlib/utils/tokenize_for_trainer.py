"""Turn a chat transcript into trainer inputs: token ids plus their labels (``masks``, -100 = not trained)."""

from __future__ import annotations

from typing import Any

from atroposlib.type_definitions import (
    IGNORE_INDEX,
    Message,  # noqa: F401 - Atropos 0.4 import path
)

#: Roles whose turns are trained on in ``train_on_all_assistant_turns`` mode.
TRAINED_ROLES = ("assistant", "agent")
#: Atropos 0.4's name for :data:`TRAINED_ROLES`.
UNMASKED_ROLES = TRAINED_ROLES


def _render_ids(tokenizer: Any, chat: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    """Token ids of ``chat`` rendered with the tokenizer's chat template.

    The template is rendered to text, then encoded without adding special tokens (the template
    already contains them), which matches ``apply_chat_template(tokenize=True)`` on every
    transformers version (v5 returns a dict from the latter).
    """
    if not chat:
        return []
    text = tokenizer.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def tokenize_for_trainer(
    tokenizer: Any,
    chat: list[dict[str, Any]],
    include_messages: bool = False,
    train_on_all_assistant_turns: bool = False,
    finish_reason: str = "",
) -> dict[str, Any]:
    """Tokenize a chat for training.

    Args:
        tokenizer: an HF tokenizer with a chat template.
        chat: ``[{"role", "content"}, ...]``; in the default mode the LAST message is the one
            trained on (normally the assistant's completion).
        include_messages: also return ``"messages": chat``.
        train_on_all_assistant_turns: train on every ``assistant``/``agent`` turn, not just the
            last message.
        finish_reason: ``"length"`` drops a trailing EOS token (the completion was cut off, so
            the model never produced it).

    Returns:
        ``{"tokens": [T], "masks": [T]}`` (+ ``"messages"``): ``tokens`` is the whole templated
        chat; ``masks`` are its labels: ``masks[t]`` is ``tokens[t]`` where trained, ``-100``
        (the ignore index) where not.

    Raises:
        ValueError: ``chat`` is empty.
    """
    if not chat:
        raise ValueError("tokenize_for_trainer needs a non-empty chat (list of messages)")
    tokens = _render_ids(tokenizer, chat, add_generation_prompt=False)
    if train_on_all_assistant_turns:
        masks = [IGNORE_INDEX] * len(tokens)
        for i, message in enumerate(chat):
            if message.get("role") not in TRAINED_ROLES:
                continue
            start = len(_render_ids(tokenizer, chat[:i], add_generation_prompt=True))
            end = min(len(tokens), len(_render_ids(tokenizer, chat[: i + 1], add_generation_prompt=False)))
            masks[start:end] = tokens[start:end]
    else:
        prefix = min(len(tokens), len(_render_ids(tokenizer, chat[:-1], add_generation_prompt=True)))
        masks = [IGNORE_INDEX] * prefix + tokens[prefix:]
    eos = getattr(tokenizer, "eos_token_id", None)
    if finish_reason == "length" and tokens and eos is not None and tokens[-1] == eos:
        tokens, masks = tokens[:-1], masks[:-1]
    result: dict[str, Any] = {"tokens": tokens, "masks": masks}
    if include_messages:
        result["messages"] = chat
    return result


__all__ = ["TRAINED_ROLES", "UNMASKED_ROLES", "tokenize_for_trainer"]
