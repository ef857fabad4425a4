"""Render observed rollout groups as safe, readable HTML (chat bubbles, markdown, scores) for view-run."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from typing import Any

import nh3
from markdown_it import MarkdownIt

from atroposlib.tools.observe import ObservedGroup
from atroposlib.tools.rollouts import (
    RolloutFormatError,
    TokenDecoder,
    first_trained_position,
    split_messages,
)

#: Stylesheet of the rendered groups (passed to Gradio's ``launch(css=...)``).
CSS = """
.atr-empty { padding: 1em; color: #666; }
.atr-group { border: 1px solid #d0d7de; border-radius: 8px; margin: 0 0 12px 0; padding: 6px 10px; }
.atr-group > summary { cursor: pointer; font-weight: 600; }
.atr-meta { color: #57606a; font-weight: 400; }
.atr-prompt { margin: 6px 0 2px 0; }
.atr-rollout { border-top: 1px dashed #d0d7de; margin-top: 8px; padding-top: 6px; }
.atr-score { display: inline-block; border-radius: 10px; padding: 1px 8px; font-size: 0.85em;
             font-weight: 600; margin-bottom: 4px; }
.atr-pos { background: #dafbe1; color: #116329; }
.atr-neg { background: #ffebe9; color: #a40e26; }
.atr-zero { background: #eaeef2; color: #424a53; }
.atr-msg { border-radius: 10px; padding: 6px 10px; margin: 4px 0; max-width: 92%; }
.atr-msg .atr-role { font-size: 0.75em; text-transform: uppercase; color: #57606a; }
.atr-msg p { margin: 0.2em 0; }
.atr-msg pre { white-space: pre-wrap; overflow-x: auto; }
.atr-system { background: #f6f8fa; border: 1px solid #d0d7de; }
.atr-user { background: #ddf4ff; margin-right: auto; }
.atr-assistant { background: #fff8c5; margin-left: auto; }
.atr-tool { background: #fbefff; }
.atr-raw { background: #f6f8fa; }
"""

_ROLE_CLASS = {"system": "atr-system", "user": "atr-user", "assistant": "atr-assistant",
               "tool": "atr-tool"}


# CommonMark with raw HTML disabled: HTML typed by a model is shown as text, not interpreted.
_MD = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable("table")


def render_markdown(text: str) -> str:
    """Markdown to HTML for untrusted rollout text.

    Raw HTML in the text is escaped (shown literally, as the model wrote it) and unsafe links are
    refused by markdown-it; the result is also passed through ``nh3.clean`` as a second guard.
    """
    return nh3.clean(_MD.render(text))


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return "" if content is None else str(content)


def _score_badge(score: float) -> str:
    cls = "atr-pos" if score > 0 else "atr-neg" if score < 0 else "atr-zero"
    if not math.isfinite(score):
        cls = "atr-neg"
    return f'<span class="atr-score {cls}">score {html.escape(f"{score:.4g}")}</span>'


def _bubble(role: str, body_html: str) -> str:
    cls = _ROLE_CLASS.get(role, "atr-raw")
    return (f'<div class="atr-msg {cls}"><div class="atr-role">{html.escape(role)}</div>'
            f"{body_html}</div>")


def _messages_html(messages: Sequence[dict[str, Any]]) -> str:
    return "".join(
        _bubble(str(m.get("role", "?")), render_markdown(_content_text(m.get("content"))))
        for m in messages
    )


def _shared_prompt(group: dict[str, Any]) -> tuple[str, list[Any]] | None:
    """``("messages" | "tokens", prompt)`` when every rollout has the same prompt, else None."""
    messages = group.get("messages")
    n = len(group.get("tokens") or [])
    try:
        if messages and len(messages) == n and all(messages):
            prompts = [split_messages(m)[0] for m in messages]
            kind = "messages"
        else:
            prompts = [t[: first_trained_position(m)]
                       for t, m in zip(group["tokens"], group["masks"], strict=True)]
            kind = "tokens"
    except (RolloutFormatError, KeyError, ValueError):
        return None
    if n < 2 or any(p != prompts[0] for p in prompts):
        return None
    return kind, prompts[0]


def _decode_or_note(decoder: TokenDecoder | None, tokens: Sequence[int]) -> str | None:
    """Decoded text, or None with no tokenizer configured; raises on tokenizer problems."""
    if decoder is None or not decoder.tokenizer_name:
        return None
    return decoder.decode(tokens)


def _rollout_body(group: dict[str, Any], i: int, decoder: TokenDecoder | None,
                  shared: tuple[str, list[Any]] | None) -> str:
    messages = group.get("messages")
    tokens = group["tokens"][i]
    if messages and i < len(messages) and messages[i]:
        if shared is not None and shared[0] == "messages":
            return _messages_html(split_messages(messages[i])[1])
        return _messages_html(messages[i])
    if decoder is None or not decoder.tokenizer_name:
        return _bubble("tokens", f"<p>{len(tokens)} tokens (start view-run with --tokenizer to "
                       "decode groups that carry no messages)</p>")
    try:
        try:
            k = first_trained_position(group["masks"][i])
        except (RolloutFormatError, IndexError):
            k = 0
        completion = decoder.decode(tokens[k:])
        prompt = "" if shared is not None else decoder.decode(tokens[:k])
    except Exception as exc:  # noqa: BLE001 - tokenizer problems are shown, not fatal
        return _bubble("tokens", f"<p>{len(tokens)} tokens; cannot decode: "
                       f"{html.escape(str(exc))}</p>")
    prompt_html = _bubble("prompt (decoded)", f"<pre>{html.escape(prompt)}</pre>") if prompt else ""
    return prompt_html + _bubble("assistant", f"<pre>{html.escape(completion)}</pre>")


def _shared_prompt_html(shared: tuple[str, list[Any]], n: int, decoder: TokenDecoder | None) -> str:
    label = f'<div class="atr-meta">prompt shared by all {n} rollouts</div>'
    kind, prompt = shared
    if kind == "messages":
        return f'<div class="atr-prompt">{label}{_messages_html(prompt)}</div>'
    try:
        text = _decode_or_note(decoder, prompt)
    except Exception as exc:  # noqa: BLE001 - shown, not fatal
        text = f"(cannot decode: {exc})"
    body = f"<pre>{html.escape(text)}</pre>" if text is not None else f"<p>{len(prompt)} tokens</p>"
    return f'<div class="atr-prompt">{label}{_bubble("prompt (decoded)", body)}</div>'


def render_group(observed: ObservedGroup, decoder: TokenDecoder | None = None) -> str:
    """HTML of one group: a collapsible block with its rollouts, best score first.

    A prompt shared by every rollout (the usual case) is shown once, above the completions.

    Args:
        observed: the group and its /observe metadata.
        decoder: decodes groups that carry only tokens (None: show token counts).

    Returns:
        An HTML fragment; every piece of rollout text is escaped or sanitised.
    """
    group = observed.group
    scores = [float(s) for s in group.get("scores") or []]
    order = sorted(range(len(scores)), key=lambda i: -scores[i] if math.isfinite(scores[i]) else math.inf)
    when = time.strftime("%H:%M:%S", time.localtime(observed.received_at)) if observed.received_at else "?"
    env = "no env id" if observed.env_id is None else f"env {observed.env_id}"
    mean = sum(scores) / len(scores) if scores else float("nan")
    summary = (f"Group #{observed.cursor} <span class='atr-meta'>· {html.escape(env)} · "
               f"received {when} · {len(scores)} rollouts · mean score {mean:.3g} · "
               f"scores {html.escape(', '.join(f'{s:.3g}' for s in scores))}</span>")
    shared = _shared_prompt(group)
    head = _shared_prompt_html(shared, len(scores), decoder) if shared is not None else ""
    rollouts = "".join(
        f'<div class="atr-rollout">{_score_badge(scores[i])}'
        f"{_rollout_body(group, i, decoder, shared)}</div>"
        for i in order
    )
    return f'<details class="atr-group" open><summary>{summary}</summary>{head}{rollouts}</details>'


def render_groups(groups: Sequence[ObservedGroup], decoder: TokenDecoder | None = None,
                  empty_message: str = "No groups yet.") -> str:
    """HTML of several groups (in the given order), or an empty-state note."""
    if not groups:
        return f'<div class="atr-empty">{html.escape(empty_message)}</div>'
    return "".join(render_group(g, decoder) for g in groups)
