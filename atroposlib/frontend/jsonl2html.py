"""Render a JSONL file of scored groups as one self-contained, sanitised HTML page.

Each group becomes a collapsible "Group N" block listing every sequence's messages and score.
Message content is rendered from Markdown and then sanitised with ``nh3`` (upstream emitted raw
model output, an XSS hole); scores and roles are HTML-escaped by the template engine (Jinja2
with autoescaping).

CLI: ``jsonl2html groups.jsonl [-o groups.html]``.
"""

from __future__ import annotations

import html
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from atroposlib.utils.cli import ArgumentParser

logger = logging.getLogger(__name__)

_TEMPLATE = Path(__file__).with_name("template.html")
_MARKDOWN_EXTENSIONS = ["fenced_code", "tables", "nl2br"]


def _markdown_to_safe_html(text: str) -> str:
    import markdown
    import nh3

    rendered = markdown.markdown(text, extensions=_MARKDOWN_EXTENSIONS)
    return nh3.clean(rendered)


def _message_html(message: Any) -> str:
    """Render one sequence's messages: a string, a list of {role, content} dicts, or other."""
    if isinstance(message, str):
        return _markdown_to_safe_html(message)
    if isinstance(message, list):
        parts = []
        for turn in message:
            if isinstance(turn, dict):
                role = html.escape(str(turn.get("role", "?")).capitalize())
                content = turn.get("content", "")
                if not isinstance(content, str):
                    content = "\n".join(
                        str(p.get("text", p)) if isinstance(p, dict) else str(p) for p in content
                    )
                parts.append(
                    f'<div class="message"><span class="role">{role}</span>'
                    f"{_markdown_to_safe_html(content)}</div>"
                )
            else:
                parts.append(f'<div class="message">{_markdown_to_safe_html(str(turn))}</div>')
        return "\n".join(parts)
    return _markdown_to_safe_html(str(message))


def _css_class(score: Any) -> str:
    try:
        value = float(score)
    except (TypeError, ValueError):
        return "reward-zero"
    if math.isnan(value) or value == 0:
        return "reward-zero"
    return "reward-positive" if value > 0 else "reward-negative"


def _group_view(index: int, messages: list[Any], scores: list[Any]) -> dict[str, Any] | None:
    if len(messages) != len(scores):
        logger.warning(
            "group %d has %d messages but %d scores; showing the first %d",
            index, len(messages), len(scores), min(len(messages), len(scores)),
        )
    n = min(len(messages), len(scores))
    if n == 0:
        return None
    items = [
        {"index": i, "score": str(scores[i]), "css": _css_class(scores[i]),
         "html": _message_html(messages[i])}
        for i in range(n)
    ]
    scores_text = ", ".join(str(s) for s in scores[:n])
    return {"index": index, "items": items, "scores_text": scores_text}


_GROUP_TEMPLATE = """\
<details class="group"{% if open %} open{% endif %}>
  <summary>Group {{ group.index }} &mdash; scores: {{ group.scores_text }}</summary>
  {% for item in group["items"] %}
  <div class="item {{ item.css }}">
    <div>Sequence {{ item.index }} &middot; score <span class="score">{{ item.score }}</span></div>
    {{ item.html }}
  </div>
  {% endfor %}
</details>"""


def _jinja_env() -> Any:
    import jinja2

    return jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)


def create_html_for_group(group_data: dict[str, Any], index: int, open: bool = False) -> str:
    """Render one group as a collapsible HTML block (a fragment of the page).

    Args:
        group_data: a JSONL record with ``messages`` (one entry per sequence: a string or a
            list of ``{role, content}`` turns) and ``scores``; without ``messages``, each
            sequence shows ``[tokens: N]``.
        index: the number shown as "Group N".
        open: render the block expanded.

    Returns:
        The HTML block (content rendered from Markdown and sanitised, scores escaped), or ``""``
        when the group has no sequence with both a message and a score. When the counts differ
        only the first ``min(len(messages), len(scores))`` sequences are shown.
    """
    import markupsafe

    messages = group_data.get("messages")
    if not messages:
        messages = [f"[tokens: {len(t)}]" for t in group_data.get("tokens") or []]
    view = _group_view(index, list(messages), list(group_data.get("scores") or []))
    if view is None:
        return ""
    for item in view["items"]:
        item["html"] = markupsafe.Markup(item["html"])
    return _jinja_env().from_string(_GROUP_TEMPLATE).render(group=view, open=open)


def render_groups(groups: list[dict[str, Any]], title: str = "Rollouts") -> str:
    """Render already-parsed groups (dicts with ``messages`` and ``scores``) to an HTML page.

    Groups without ``messages`` (e.g. written without ``include_messages``) show decoded
    placeholders ``[tokens: N]`` so the page still lists every score.
    """
    import markupsafe

    template = _jinja_env().from_string(_TEMPLATE.read_text(encoding="utf-8"))
    blocks = []
    for k, group in enumerate(groups, start=1):
        block = create_html_for_group(group, k, open=not blocks)
        if block:
            blocks.append(markupsafe.Markup(block))
    return template.render(title=title, groups=blocks, skipped=0)


def generate_html(input_path: str | Path, output_path: str | Path | None = None) -> Path:
    """Convert a JSONL file of groups to a sanitised, self-contained HTML page.

    Lines without both ``messages`` and ``scores`` (or not valid JSON) are skipped with a
    warning.

    Args:
        input_path: the ``.jsonl`` file.
        output_path: where to write; default ``input_path`` with suffix ``.html``.

    Returns:
        The path written.

    Raises:
        FileNotFoundError: ``input_path`` does not exist.
    """
    import markupsafe

    input_path = Path(input_path)
    if not input_path.is_file():
        raise FileNotFoundError(f"{input_path} does not exist; pass a JSONL file of groups")
    output_path = Path(output_path) if output_path else input_path.with_suffix(".html")
    blocks: list[Any] = []
    skipped = 0
    with open(input_path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                logger.warning("%s:%d is not valid JSON (%s); skipped", input_path, line_no, exc)
                skipped += 1
                continue
            if not isinstance(record, dict) or "messages" not in record or "scores" not in record:
                logger.warning("%s:%d has no messages/scores; skipped", input_path, line_no)
                skipped += 1
                continue
            if record["messages"] is None:
                logger.warning("%s:%d has messages=null; skipped", input_path, line_no)
                skipped += 1
                continue
            block = create_html_for_group(record, len(blocks) + 1, open=not blocks)
            if block:
                blocks.append(markupsafe.Markup(block))
    template = _jinja_env().from_string(_TEMPLATE.read_text(encoding="utf-8"))
    page = template.render(title=input_path.name, groups=blocks, skipped=skipped)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    output_path.write_text(page, encoding="utf-8")
    return output_path


def main(argv: list[str] | None = None) -> None:
    """CLI entry point ``jsonl2html INPUT [-o OUTPUT]``."""
    parser = ArgumentParser(
        prog="jsonl2html", description="Render a JSONL file of scored groups as HTML."
    )
    parser.add_argument("input_path", help="JSONL file written by `process` or the API.")
    parser.add_argument("-o", "--output", default=None, help="Output .html (default: INPUT.html).")
    args = parser.parse_args(argv)
    try:
        path = generate_html(args.input_path, args.output)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    print(path)


__all__ = ["generate_html", "main", "render_groups"]


if __name__ == "__main__":
    main()
