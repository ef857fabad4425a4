"""Output layouts of the SFT and DPO datasets (TRL/Axolotl-ready or Atropos 0.4 legacy) and the JSONL writer."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonlines
import orjson

from atroposlib.errors import ConfigError
from atroposlib.tools.rollouts import (
    RolloutFormatError,
    TokenDecoder,
    first_trained_position,
    group_messages,
    split_messages,
)


class OutputFormat(enum.StrEnum):
    """The ``--format`` choices of ``atropos-sft-gen`` / ``atropos-dpo-gen``."""

    AUTO = "auto"
    """``chat`` when the groups carry chat messages, else ``text`` (decided once per file)."""
    CHAT = "chat"
    """Conversational (TRL/Axolotl): SFT ``{"messages", "score"}``; DPO ``{"prompt": [msgs],
    "chosen": [msgs], "rejected": [msgs], "score_chosen", "score_rejected"}``."""
    TEXT = "text"
    """Standard text (TRL prompt-completion / preference): SFT ``{"prompt", "completion", "score"}``;
    DPO ``{"prompt", "chosen", "rejected", "score_chosen", "score_rejected"}``, decoded from tokens."""
    LEGACY = "legacy"
    """Atropos 0.4's layout: SFT ``{"prefix", "completion", "score"}`` (or ``{"messages", "score"}``
    with ``--save-messages``); DPO ``{"prefix", "pos", "score", "neg"}`` (or ``{"pos", "neg",
    "score"}`` with messages)."""


class Layout(enum.StrEnum):
    """A concrete record layout (what :class:`OutputFormat` resolves to)."""

    CHAT = "chat"
    TEXT = "text"
    LEGACY_TEXT = "legacy_text"
    LEGACY_MESSAGES = "legacy_messages"


def has_chat_messages(group: Mapping[str, Any]) -> bool:
    """Whether the group's rollouts carry chat messages with an assistant turn to train on.

    Messages that an env synthesised from tokens (one ``user`` message holding the whole decoded
    sequence) do not count: they have no assistant turn.
    """
    messages = group_messages(dict(group), 0)
    if messages is None:
        return False
    try:
        split_messages(messages)
    except RolloutFormatError:
        return False
    return True


def layout_of_record(record: Mapping[str, Any], kind: str) -> Layout | None:
    """Infer the layout of an existing output line (used with ``--append-to-previous``).

    Args:
        record: one decoded JSONL line.
        kind: ``"sft"`` or ``"dpo"``.

    Returns:
        The layout, or None when the line matches none of this tool's layouts.
    """
    keys = set(record)
    if kind == "sft":
        if "messages" in keys:
            return Layout.CHAT
        if {"prompt", "completion"} <= keys:
            return Layout.TEXT
        if {"prefix", "completion"} <= keys:
            return Layout.LEGACY_TEXT
        return None
    if {"prompt", "chosen", "rejected"} <= keys:
        return Layout.CHAT if isinstance(record["prompt"], list) else Layout.TEXT
    if {"prefix", "pos", "neg"} <= keys:
        return Layout.LEGACY_TEXT
    if {"pos", "neg"} <= keys:
        return Layout.LEGACY_MESSAGES
    return None


class LayoutResolver:
    """Fix one record layout per output file, so every line has the same schema.

    ``datasets.load_dataset("json")`` needs one schema per file, so ``auto`` is resolved once, on
    the first group (or from the file being appended to) and then kept.
    """

    def __init__(self, fmt: OutputFormat, *, save_messages: bool = False, existing: Layout | None = None):
        """Resolve what can be resolved before seeing any group.

        Args:
            fmt: the requested ``--format``.
            save_messages: ``--save-messages`` (legacy: the messages layout; auto: chat).
            existing: the layout of the file being appended to, if any.

        Raises:
            ConfigError: the requested format contradicts the file being appended to.
        """
        wanted: Layout | None = {
            OutputFormat.CHAT: Layout.CHAT,
            OutputFormat.TEXT: Layout.TEXT,
            OutputFormat.LEGACY: Layout.LEGACY_MESSAGES if save_messages else Layout.LEGACY_TEXT,
            OutputFormat.AUTO: Layout.CHAT if save_messages else None,
        }[fmt]
        if existing is not None and wanted is not None and _schema(wanted) != _schema(existing):
            raise ConfigError(
                f"the output file holds {existing.value!r} records but --format {fmt.value} "
                f"writes {wanted.value!r} records; mixing them makes a file datasets cannot load. "
                "Drop --format (auto follows the file), or write to a new file"
            )
        self.layout: Layout | None = existing if wanted is None else wanted

    def resolve(self, group: Mapping[str, Any]) -> Layout:
        """The layout to use, deciding it from ``group`` if still open (``auto``)."""
        if self.layout is None:
            self.layout = Layout.CHAT if has_chat_messages(group) else Layout.TEXT
        return self.layout


def _schema(layout: Layout) -> str:
    # chat SFT lines and legacy --save-messages SFT lines are the same {"messages","score"}.
    return "messages" if layout in (Layout.CHAT, Layout.LEGACY_MESSAGES) else layout.value


def _messages_or_raise(group: Mapping[str, Any], index: int) -> list[dict[str, Any]]:
    messages = group_messages(dict(group), index)
    if messages is None:
        raise RolloutFormatError(
            "the group carries no chat messages (the env did not send them: set "
            "include_messages=True in its config), or use --format text to decode tokens"
        )
    return messages


def sft_record(
    group: Mapping[str, Any], index: int, layout: Layout, decoder: TokenDecoder
) -> dict[str, Any]:
    """Build one SFT line from rollout ``index`` of ``group``.

    Args:
        group: a ScoredDataGroup (wire dict: tokens, masks, scores, optional messages).
        index: which rollout.
        layout: the record layout (see :class:`OutputFormat`).
        decoder: decodes token-only rollouts (text layouts).

    Returns:
        ``{"messages", "score"}`` (chat, legacy messages), ``{"prompt", "completion", "score"}``
        (text) or ``{"prefix", "completion", "score"}`` (legacy text).

    Raises:
        RolloutFormatError: the rollout cannot be expressed in this layout.
        ConfigError: token-only rollout and no loadable tokenizer.
    """
    score = float(group["scores"][index])
    if layout in (Layout.CHAT, Layout.LEGACY_MESSAGES):
        messages = _messages_or_raise(group, index)
        split_messages(messages)  # validates: there is an assistant turn to train on
        return {"messages": messages, "score": score}
    prompt, completion = decoder.split(group["tokens"][index], group["masks"][index])
    if layout is Layout.TEXT:
        return {"prompt": prompt, "completion": completion, "score": score}
    return {"prefix": prompt, "completion": completion, "score": score}


def dpo_record(
    group: Mapping[str, Any], chosen: int, rejected: int, layout: Layout, decoder: TokenDecoder
) -> dict[str, Any]:
    """Build one preference line from two rollouts of ``group`` that share a prompt.

    Args:
        group: a ScoredDataGroup (wire dict).
        chosen: index of the preferred (higher-scored) rollout.
        rejected: index of the dispreferred rollout.
        layout: the record layout (see :class:`OutputFormat`).
        decoder: decodes token-only rollouts (text layouts).

    Returns:
        chat: ``{"prompt": [msgs], "chosen": [msgs], "rejected": [msgs], "score_chosen",
        "score_rejected"}``; text: the same keys with strings; legacy text:
        ``{"prefix", "pos", "score", "neg"}``; legacy messages: ``{"pos", "neg", "score"}``.

    Raises:
        RolloutFormatError: the two rollouts do not share a prompt, or cannot be expressed in
            this layout.
        ConfigError: token-only rollouts and no loadable tokenizer.
    """
    s_c, s_r = float(group["scores"][chosen]), float(group["scores"][rejected])
    if layout in (Layout.CHAT, Layout.LEGACY_MESSAGES):
        m_c, m_r = _messages_or_raise(group, chosen), _messages_or_raise(group, rejected)
        (p_c, c_c), (p_r, c_r) = split_messages(m_c), split_messages(m_r)
        if p_c != p_r:
            raise RolloutFormatError("chosen and rejected rollouts have different prompts")
        if layout is Layout.LEGACY_MESSAGES:
            return {"pos": m_c, "neg": m_r, "score": s_c}
        return {"prompt": p_c, "chosen": c_c, "rejected": c_r, "score_chosen": s_c,
                "score_rejected": s_r}
    t_c, t_r = group["tokens"][chosen], group["tokens"][rejected]
    mk_c, mk_r = group["masks"][chosen], group["masks"][rejected]
    k_c, k_r = first_trained_position(mk_c), first_trained_position(mk_r)
    if list(t_c[:k_c]) != list(t_r[:k_r]):
        raise RolloutFormatError("chosen and rejected rollouts have different prompt tokens")
    prompt, completion_c = decoder.split(t_c, mk_c)
    completion_r = decoder.decode(t_r[k_r:])
    if layout is Layout.TEXT:
        return {"prompt": prompt, "chosen": completion_c, "rejected": completion_r,
                "score_chosen": s_c, "score_rejected": s_r}
    return {"prefix": prompt, "pos": completion_c, "score": s_c, "neg": completion_r}


def read_existing_layout(path: Path, kind: str) -> Layout | None:
    """Layout of the first line of an existing JSONL file, or None if it is missing or empty.

    Raises:
        ConfigError: the first line is not JSON or not a layout this tool writes.
    """
    if not path.exists() or path.stat().st_size == 0:
        return None
    with path.open("rb") as fh:
        first = fh.readline()
    try:
        record = orjson.loads(first)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{path} does not start with a JSON line ({exc}); choose another output file") from exc
    layout = layout_of_record(record, kind) if isinstance(record, dict) else None
    if layout is None:
        raise ConfigError(
            f"{path} holds lines with keys {sorted(record) if isinstance(record, dict) else type(record).__name__}, "
            f"not a {kind.upper()} dataset this tool writes; choose another output file"
        )
    return layout


class JsonlOutput:
    """Append-only JSONL writer that flushes each line, so an interrupted run keeps its data.

    The file is created (or opened for appending) only when the first line is written: a run
    that fails before writing anything leaves no empty file behind to block the next run.
    """

    def __init__(self, path: str | Path, *, append: bool = False):
        """Check ``path`` can be written; it is opened on the first :meth:`write`.

        Args:
            path: output file (parent directories are created on the first write).
            append: add to an existing file (``--append-to-previous``); otherwise the file must
                not exist.

        Raises:
            ConfigError: the file exists and ``append`` is False.
        """
        self.path = Path(path)
        if self.path.exists() and not append:
            raise ConfigError(
                f"{self.path} already exists; pass --append-to-previous to add to it, or choose "
                "another output path"
            )
        self._fh: Any = None
        self._writer: jsonlines.Writer | None = None
        self.lines_written = 0

    def write(self, record: Mapping[str, Any]) -> None:
        """Write one record as one line (creating the file on the first one)."""
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")
            self._writer = jsonlines.Writer(
                self._fh, flush=True, dumps=lambda obj: orjson.dumps(obj).decode("utf-8")
            )
        self._writer.write(record)
        self.lines_written += 1

    def close(self) -> None:
        """Close the file (if a line was written)."""
        if self._writer is not None:
            self._writer.close()
            self._fh.close()
            self._writer = None

    def __enter__(self) -> JsonlOutput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
