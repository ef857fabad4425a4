"""Turn one scored group into readable rollouts: split chat messages or decode tokens by their masks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from atroposlib.api.models import IGNORE_INDEX
from atroposlib.errors import AtroposError, ConfigError


class RolloutFormatError(AtroposError, ValueError):
    """One rollout of a group cannot be turned into a training example (the reason says why)."""


def first_trained_position(masks: Sequence[int]) -> int:
    """Index of the first token that is trained on, i.e. where the completion starts.

    Atropos masks are label vectors: ``-100`` at prompt positions, the token id elsewhere. The
    prompt is the leading run of ``-100``; everything from the first trained position on
    (including any later ``-100`` spans such as tool outputs) belongs to the completion.

    Args:
        masks: ``[T]`` label vector of one rollout.

    Returns:
        ``k`` such that ``tokens[:k]`` is the prompt and ``tokens[k:]`` the completion.

    Raises:
        RolloutFormatError: every position is ``-100`` (nothing was generated or trained).
    """
    for k, label in enumerate(masks):
        if label != IGNORE_INDEX:
            return k
    raise RolloutFormatError("every mask position is -100, so the rollout has no completion")


def split_messages(messages: Sequence[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """Split a conversation into the prompt and the policy's completion.

    The completion is everything after the last ``user`` message (the assistant's answer,
    including any tool calls and tool results that followed); without a user message it starts
    at the first ``assistant`` message. This is the split TRL's conversational
    prompt/completion and preference formats expect.

    Args:
        messages: ``[turns]`` chat messages, each a dict with ``role`` and ``content``.

    Returns:
        ``(prompt_messages, completion_messages)``; both non-empty.

    Raises:
        RolloutFormatError: the conversation has no prompt or no assistant turn to train on.
    """
    roles = [m.get("role") for m in messages]
    if "user" in roles:
        cut = len(roles) - 1 - roles[::-1].index("user") + 1
    elif "assistant" in roles:
        cut = roles.index("assistant")
    else:
        raise RolloutFormatError(f"no assistant message in the conversation (roles: {roles})")
    prompt, completion = list(messages[:cut]), list(messages[cut:])
    if not prompt:
        raise RolloutFormatError("the conversation starts with the assistant: no prompt to condition on")
    if not any(m.get("role") == "assistant" for m in completion):
        raise RolloutFormatError(
            f"no assistant message after the last user message (roles: {roles})"
        )
    return prompt, completion


def load_decoding_tokenizer(name: str) -> Any:
    """Load a tokenizer for decoding only, as cheaply as possible.

    With a ``tokenizer.json`` (a local directory that has one, or a hub id whose file is in the
    cache or reachable) this is a ``tokenizers.Tokenizer``: 0.1 s of CPU, where
    ``transformers.AutoTokenizer`` costs ~4 s because it imports torch. That matters for tools
    that run beside a training run on a busy machine. Both objects decode with
    ``decode(ids, skip_special_tokens=False)``; the raw decode is used (no
    ``clean_up_tokenization_spaces``), which keeps the model's text exactly as generated.
    Without a ``tokenizer.json`` (sentencepiece-only models) it falls back to ``AutoTokenizer``.

    Args:
        name: a local tokenizer directory or a hub id.

    Returns:
        An object with ``decode(ids: list[int], skip_special_tokens: bool) -> str``.

    Raises:
        Exception: whatever ``transformers.AutoTokenizer.from_pretrained`` raises when neither
            route can load ``name`` (e.g. ``OSError`` offline).
    """
    path = Path(name)
    file: Path | None = path / "tokenizer.json" if path.is_dir() else None
    if file is None and not path.exists():
        from huggingface_hub import hf_hub_download

        try:
            file = Path(hf_hub_download(name, "tokenizer.json"))
        except Exception:  # noqa: BLE001 - no tokenizer.json (or not reachable): slow route
            file = None
    if file is not None and file.is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(file))
    from atroposlib.utils.hf_tokenizer import load_tokenizer  # lazy: imports torch

    return load_tokenizer(name)


class TokenDecoder:
    """Decode rollout tokens with a Hugging Face tokenizer, loaded lazily on first use.

    Groups that carry no ``messages`` only have token ids; this turns them into text. Special
    tokens are kept (``skip_special_tokens=False``), so the decoded prompt still contains the
    chat template, and the text is the raw decode (see :func:`load_decoding_tokenizer`), so
    ``prompt + completion`` is exactly the decoded trained sequence.
    """

    def __init__(self, tokenizer_name: str | None):
        """Remember which tokenizer to load.

        Args:
            tokenizer_name: a hub id or local directory (``--tokenizer``); None means token-only
                groups cannot be decoded.
        """
        self.tokenizer_name = tokenizer_name
        self._tokenizer: Any = None
        self._error: ConfigError | None = None

    @property
    def tokenizer(self) -> Any:
        """The loaded tokenizer.

        Raises:
            ConfigError: no tokenizer was configured, or it cannot be loaded (offline, typo).
        """
        if self._error is not None:
            raise self._error  # failed once: do not retry a slow hub lookup on every rollout
        if self._tokenizer is None:
            if not self.tokenizer_name:
                raise ConfigError(
                    "this group carries only token ids; pass --tokenizer NAME_OR_DIR (the "
                    "tokenizer of the policy model) to decode them"
                )
            try:
                self._tokenizer = load_decoding_tokenizer(self.tokenizer_name)
            except Exception as exc:  # noqa: BLE001 - re-raised with the fix
                self._error = ConfigError(
                    f"cannot load tokenizer {self.tokenizer_name!r} ({type(exc).__name__}: {exc}); "
                    "pass --tokenizer with a local tokenizer directory or a hub id available "
                    "offline (HF_HUB_OFFLINE=1 needs it in the cache)"
                )
                raise self._error from exc
        return self._tokenizer

    def decode(self, tokens: Sequence[int]) -> str:
        """Decode token ids to text, special tokens included."""
        return self.tokenizer.decode(list(tokens), skip_special_tokens=False)

    def split(self, tokens: Sequence[int], masks: Sequence[int]) -> tuple[str, str]:
        """Decode one rollout into ``(prompt_text, completion_text)``, split by its masks.

        Args:
            tokens: ``[T]`` token ids, prompt plus completion.
            masks: ``[T]`` labels; the leading ``-100`` run is the prompt.

        Returns:
            The decoded prompt and completion.

        Raises:
            RolloutFormatError: ``tokens`` and ``masks`` differ in length, or nothing is trained.
            ConfigError: the tokenizer cannot be loaded.
        """
        if len(tokens) != len(masks):
            raise RolloutFormatError(
                f"tokens ({len(tokens)}) and masks ({len(masks)}) differ in length"
            )
        k = first_trained_position(masks)
        return self.decode(tokens[:k]), self.decode(tokens[k:])


def group_messages(group: dict[str, Any], index: int) -> list[dict[str, Any]] | None:
    """The chat messages of rollout ``index`` of ``group``, or None when the group has none."""
    messages = group.get("messages")
    if not messages or index >= len(messages) or not messages[index]:
        return None
    return list(messages[index])
