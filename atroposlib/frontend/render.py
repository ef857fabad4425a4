"""The one renderer of rollout groups as HTML, shared by ``jsonl2html`` / ``process`` and ``view-run``.

Rollout text is untrusted and is shown exactly as the model wrote it: Markdown is rendered by
markdown-it-py in CommonMark mode with raw HTML disabled, so tags such as ``<think>``,
``<answer>`` or ``<script>`` appear literally as text (escaped), never interpreted and never
removed; unsafe link targets (``javascript:``) are refused by markdown-it. Everything else (roles,
scores, titles) goes through Jinja2 templates with autoescaping on. The templates and the one
stylesheet live in ``atroposlib/frontend/templates/``.

Per group the view shows the prompt once when every rollout shares it, the reference answer
when the group carries one (see :func:`reference_answer`), each completion with its score and
length, and summary statistics (see :class:`ScoreStats`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt
from markupsafe import Markup

from atroposlib.type_definitions import REFERENCE_KEY  # top level, or inside group_overrides

_TEMPLATES = Path(__file__).with_name("templates")

#: The stylesheet of every rendered view (embedded in ``jsonl2html`` pages, passed to Gradio).
CSS = (_TEMPLATES / "style.css").read_text(encoding="utf-8")


_ROLE_CLASS = {"system": "atr-system", "user": "atr-user", "assistant": "atr-assistant",
               "tool": "atr-tool"}

# CommonMark with raw HTML disabled: HTML typed by a model is escaped and shown as text.
_MD = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable("table")


def render_markdown(text: str) -> Markup:
    """Render untrusted rollout text (Markdown) to safe HTML.

    Raw HTML in ``text`` is escaped, so ``<think>x</think>`` shows literally as
    ``&lt;think&gt;x&lt;/think&gt;``; nothing is stripped. Links with unsafe schemes
    (``javascript:``, ``vbscript:``, ``data:`` other than images) are not turned into links.

    Returns:
        The HTML, marked safe for Jinja2.
    """
    return Markup(_MD.render(text))


@lru_cache(maxsize=1)
def _env() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
    )


# ---------------------------------------------------------------------------------- statistics


def score_value(score: Any) -> float | None:
    """The score as a finite float, or None when it is missing, not a number, NaN or infinite."""
    if isinstance(score, bool):
        return float(score)
    try:
        value = float(score)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def is_correct(score: Any) -> bool:
    """Whether a rollout counts as correct in the summaries: its score is a number ``> 0``.

    This follows the usual reward convention of verifiable-answer envs (``1`` right, ``0`` or
    ``-1`` wrong); for envs whose scores are all positive the share is 1 and only the mean is
    informative.
    """
    value = score_value(score)
    return value is not None and value > 0


@dataclass(frozen=True)
class ScoreStats:
    """Summary of a set of rollouts (one group, or all groups of a file / view).

    Attributes:
        groups: number of groups summarised.
        rollouts: number of rollouts.
        scored: rollouts with a numeric, finite score (others are ignored by the score stats).
        mean_score: mean of those scores, or None when there are none.
        share_correct: fraction of scored rollouts with score ``> 0`` (see :func:`is_correct`),
            or None when none is scored.
        mean_length / min_length / max_length: completion length in tokens (tokens from the
            first trained position on, i.e. ``len(tokens) - first_trained_position(masks)``) over
            the rollouts that carry tokens and masks; None when none does.
    """

    groups: int
    rollouts: int
    scored: int
    mean_score: float | None
    share_correct: float | None
    mean_length: float | None
    min_length: int | None
    max_length: int | None

    @classmethod
    def of(cls, scores: Sequence[Any], lengths: Sequence[int | None], groups: int = 1) -> ScoreStats:
        """Summarise raw scores and completion lengths (None entries: length unknown)."""
        values = [v for v in (score_value(s) for s in scores) if v is not None]
        known = [n for n in lengths if n is not None]
        return cls(
            groups=groups,
            rollouts=len(scores),
            scored=len(values),
            mean_score=sum(values) / len(values) if values else None,
            share_correct=sum(v > 0 for v in values) / len(values) if values else None,
            mean_length=sum(known) / len(known) if known else None,
            min_length=min(known) if known else None,
            max_length=max(known) if known else None,
        )

    def describe(self) -> str:
        """One line such as ``4 rollouts · mean score 0.5 · 50% correct (score > 0) · ...``."""
        parts = [f"{self.rollouts} rollouts"]
        if self.mean_score is not None:
            parts.append(f"mean score {self.mean_score:.3g}")
            parts.append(f"{self.share_correct:.0%} correct (score > 0)")
        else:
            parts.append("no numeric scores")
        if self.mean_length is not None:
            parts.append(f"completion tokens mean {self.mean_length:.1f} "
                         f"(min {self.min_length}, max {self.max_length})")
        return " · ".join(parts)


def completion_lengths(group: dict[str, Any]) -> list[int | None]:
    """``[G]`` completion length in tokens of each rollout (None when it has no tokens/masks)."""
    from atroposlib.tools.rollouts import RolloutFormatError, first_trained_position

    tokens = group.get("tokens") or []
    masks = group.get("masks") or []
    out: list[int | None] = []
    for i in range(len(group.get("scores") or [])):
        try:
            out.append(len(tokens[i]) - first_trained_position(masks[i]))
        except (IndexError, TypeError, RolloutFormatError):
            out.append(None)
    return out


def group_stats(group: dict[str, Any]) -> ScoreStats:
    """:class:`ScoreStats` of one group dict (``scores``, optional ``tokens`` and ``masks``)."""
    return ScoreStats.of(list(group.get("scores") or []), completion_lengths(group))


def pooled_stats(groups: Iterable[dict[str, Any]]) -> ScoreStats:
    """:class:`ScoreStats` over every rollout of several groups (pooled, not a mean of means)."""
    scores: list[Any] = []
    lengths: list[int | None] = []
    n = 0
    for group in groups:
        n += 1
        scores += list(group.get("scores") or [])
        lengths += completion_lengths(group)
    return ScoreStats.of(scores, lengths, groups=n)


def reference_answer(group: dict[str, Any]) -> str | None:
    """The group's reference (gold) answer, when it carries one.

    The ScoredDataGroup wire format has no field for it, so it is read from an optional key:
    ``group_overrides["reference_answer"]`` (kept by ``run-api``, so ``view-run`` sees it) or a
    top-level ``"reference_answer"`` (kept in the JSONL files ``process`` writes, dropped by
    ``run-api``). ``SingleTurnEnv`` sets the first from its ``answer(item)``; other envs can
    call :func:`atroposlib.envs.groups.set_reference_answer`.
    """
    overrides = group.get("group_overrides")
    value = overrides.get(REFERENCE_KEY) if isinstance(overrides, dict) else None
    if value is None:
        value = group.get(REFERENCE_KEY)
    return None if value is None else str(value)


# ---------------------------------------------------------------------------------- group view


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type", "text") == "text" and "text" in part:
                parts.append(str(part["text"]))
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return "" if content is None else str(content)


def _turn(role: str | None, body: Markup) -> dict[str, Any]:
    css = _ROLE_CLASS.get(role or "", "atr-raw")
    return {"role": (role or "").capitalize(), "css": css, "body": body}


def _turns(messages: Any) -> list[dict[str, Any]]:
    """Chat turns of one rollout: a list of ``{role, content}`` dicts, a string, or other."""
    if isinstance(messages, list):
        return [
            _turn(str(m.get("role", "?")), render_markdown(_content_text(m.get("content"))))
            if isinstance(m, dict) else _turn(None, render_markdown(str(m)))
            for m in messages
        ]
    return [_turn(None, render_markdown(str(messages)))]


def _pre(text: str) -> Markup:
    return Markup("<pre>{}</pre>").format(text)


def _shared_prompt(messages: list[Any], group: dict[str, Any]) -> tuple[str, list[Any]] | None:
    """``("messages" | "tokens", prompt)`` when every rollout has the same prompt, else None."""
    from atroposlib.tools.rollouts import (
        RolloutFormatError,
        first_trained_position,
        split_messages,
    )

    n = len(messages)
    try:
        if n and all(isinstance(m, list) and m and all(isinstance(t, dict) for t in m)
                     for m in messages):
            prompts = [split_messages(m)[0] for m in messages]
            kind = "messages"
        elif not any(messages) and group.get("tokens"):
            prompts = [t[: first_trained_position(k)]
                       for t, k in zip(group["tokens"][:n], group["masks"][:n], strict=True)]
            kind = "tokens"
        else:
            return None
    except (RolloutFormatError, KeyError, ValueError, TypeError):
        return None
    if n == 0 or any(p != prompts[0] for p in prompts):
        return None
    return kind, prompts[0]


def _decode(decoder: Any, tokens: Sequence[int]) -> str | None:
    """Decoded text, None with no tokenizer configured; raises on tokenizer problems."""
    if decoder is None or not getattr(decoder, "tokenizer_name", None):
        return None
    return decoder.decode(tokens)


def _token_turns(group: dict[str, Any], i: int, decoder: Any, shared: bool) -> list[dict[str, Any]]:
    from atroposlib.tools.rollouts import RolloutFormatError, first_trained_position

    tokens = (group.get("tokens") or [[]] * (i + 1))[i]
    if decoder is None or not getattr(decoder, "tokenizer_name", None):
        return [_turn("tokens", Markup("<p>{} tokens (decode them with a tokenizer: view-run "
                                       "--tokenizer)</p>").format(len(tokens)))]
    try:
        try:
            k = first_trained_position(group["masks"][i])
        except (RolloutFormatError, IndexError, KeyError):
            k = 0
        completion = decoder.decode(tokens[k:])
        prompt = "" if shared else decoder.decode(tokens[:k])
    except Exception as exc:  # noqa: BLE001 - tokenizer problems are shown, not fatal
        return [_turn("tokens", Markup("<p>{} tokens; cannot decode: {}</p>").format(len(tokens), exc))]
    prompt_turns = [_turn("prompt (decoded)", _pre(prompt))] if prompt else []
    return prompt_turns + [_turn("assistant", _pre(completion))]


def _score_css(value: float | None) -> str:
    if value is None:
        return "atr-zero"
    return "atr-pos" if value > 0 else "atr-neg" if value < 0 else "atr-zero"


def _score_text(score: Any) -> str:
    value = score_value(score)
    return f"{value:.4g}" if value is not None else str(score)


def group_view(group: dict[str, Any], *, title: str, meta: Sequence[str] = (),
               decoder: Any = None) -> dict[str, Any]:
    """Build the template context of one group (pure data; :func:`render_group_html` renders it).

    Args:
        group: a ScoredDataGroup dict: ``scores`` plus ``messages`` (one entry per rollout: a
            list of ``{role, content}`` turns or a string) and/or ``tokens`` and ``masks``.
            When ``messages`` and ``scores`` differ in length only the first
            ``min(len(messages), len(scores))`` rollouts are shown.
        title: the heading, e.g. ``"Group 3"``.
        meta: extra header notes (env id, time received), escaped.
        decoder: a :class:`~atroposlib.tools.rollouts.TokenDecoder` used for rollouts without
            messages (None: show token counts).

    Returns:
        ``{"title", "meta", "stats", "scores_text", "prompt", "reference", "rollouts"}``;
        rollouts are ordered best score first (non-numeric scores last), each keeping its index.
    """
    scores = list(group.get("scores") or [])
    messages = group.get("messages")
    if messages:
        n = min(len(messages), len(scores))
        messages = list(messages[:n])
    else:
        n = len(scores)
        messages = [None] * n
    scores = scores[:n]
    lengths = completion_lengths(group)[:n]
    shared = _shared_prompt(messages, group)
    prompt = None
    if shared is not None and shared[0] == "messages":
        prompt = _turns(shared[1])
    elif shared is not None:
        try:
            text = _decode(decoder, shared[1])
        except Exception as exc:  # noqa: BLE001 - shown, not fatal
            text = f"(cannot decode: {exc})"
        body = _pre(text) if text is not None else Markup("<p>{} tokens</p>").format(len(shared[1]))
        prompt = [_turn("prompt (decoded)", body)]

    def turns_of(i: int) -> list[dict[str, Any]]:
        if messages[i]:
            if shared is not None and shared[0] == "messages":
                from atroposlib.tools.rollouts import split_messages

                return _turns(split_messages(messages[i])[1])
            return _turns(messages[i])
        return _token_turns(group, i, decoder, shared is not None)

    def rank(i: int) -> float:
        value = score_value(scores[i])
        return -value if value is not None else math.inf

    rollouts = [
        {"index": i, "score_text": _score_text(scores[i]), "css": _score_css(score_value(scores[i])),
         "length": lengths[i], "turns": turns_of(i)}
        for i in sorted(range(n), key=rank)
    ]
    ref = reference_answer(group)
    return {
        "title": title,
        "meta": list(meta),
        "stats": ScoreStats.of(scores, lengths),
        "scores_text": ", ".join(_score_text(s) for s in scores),
        "prompt": prompt,
        "reference": None if ref is None else _turn(None, render_markdown(ref)),
        "rollouts": rollouts,
    }


def render_group_html(group: dict[str, Any], *, title: str, meta: Sequence[str] = (),
                      decoder: Any = None, open: bool = True) -> Markup:
    """HTML of one group: a collapsible block (see :func:`group_view` for the arguments).

    Returns:
        The block, or an empty string when the group has no rollout with a score.
    """
    view = group_view(group, title=title, meta=meta, decoder=decoder)
    if not view["rollouts"]:
        return Markup("")
    return Markup(_env().get_template("group.html").render(g=view, open=open))


def render_summary(stats: ScoreStats, label: str) -> Markup:
    """One summary line, e.g. ``"This file: 3 group(s) · 12 rollouts · mean score ..."``."""
    return Markup(_env().get_template("summary.html").render(stats=stats, label=label).strip())


def render_empty(message: str) -> Markup:
    """The empty-state note (escaped)."""
    return Markup('<div class="atr-empty">{}</div>').format(message)


def render_page(blocks: Sequence[str], *, title: str, stats: ScoreStats, skipped: int = 0) -> str:
    """A self-contained HTML page: title, file summary, then the group blocks (already rendered)."""
    return _env().get_template("page.html").render(
        title=title, summary=render_summary(stats, "This file"), skipped=skipped,
        groups=[Markup(b) for b in blocks],
    )


def render_groups_html(groups: Iterable[tuple[dict[str, Any], str, Sequence[str]]],
                       decoder: Any = None, *, summary_label: str | None = None,
                       empty_message: str = "No groups.") -> Markup:
    """Several groups, optionally preceded by a summary line over all of them.

    Args:
        groups: ``(group dict, title, meta notes)`` per group, in display order.
        decoder: see :func:`group_view`.
        summary_label: label of the pooled summary line; None: no summary.
        empty_message: shown (escaped) when there are no groups.
    """
    items = list(groups)
    if not items:
        return render_empty(empty_message)
    head = render_summary(pooled_stats(g for g, _, _ in items), summary_label) if summary_label else ""
    body = "".join(render_group_html(g, title=t, meta=m, decoder=decoder) for g, t, m in items)
    return Markup(head) + Markup(body)


__all__ = [
    "CSS", "REFERENCE_KEY", "ScoreStats", "completion_lengths", "group_stats", "group_view",
    "is_correct", "pooled_stats", "reference_answer", "render_empty", "render_group_html",
    "render_groups_html", "render_markdown", "render_page", "render_summary", "score_value",
]
