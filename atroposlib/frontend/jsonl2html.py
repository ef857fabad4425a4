"""Render a JSONL file of scored groups as one self-contained HTML page (``process`` writes one).

Each group becomes a collapsible "Group N" block: the prompt once when all rollouts share it, the
reference answer when the group carries one, every completion with its score and length, and
summary statistics per group and for the whole file. Rendering is done by
:mod:`atroposlib.frontend.render`, the same renderer ``view-run`` uses: rollout text is rendered
from Markdown with raw HTML escaped, so ``<think>``/``<answer>`` tags show literally (nothing is
stripped) and nothing the model wrote can run.

CLI: ``jsonl2html groups.jsonl [-o groups.html]``.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from atroposlib.frontend.render import (
    _score_css,
    pooled_stats,
    render_group_html,
    render_page,
    score_value,
)
from atroposlib.utils.flags import ArgumentParser

logger = logging.getLogger(__name__)

#: This package's directory (Atropos 0.4 name).
SCRIPT_DIR = Path(__file__).parent.resolve()
#: The page template the HTML is rendered with (Jinja, beside the group/summary templates).
TEMPLATE_FILE = SCRIPT_DIR / "templates" / "page.html"


def get_score_class(score: Any) -> str:
    """The CSS class the rendered page gives a score.

    Args:
        score: a rollout's score (any value).

    Returns:
        ``"atr-pos"`` (> 0), ``"atr-neg"`` (< 0) or ``"atr-zero"`` for a finite number (bools
        count as 1/0); ``""`` for anything that is not a finite number.
    """
    value = score_value(score)
    return "" if value is None else _score_css(value)


def _fire_or_none(name: str) -> Any:
    """``fire``: the python-fire module when installed, else None (as in Atropos 0.4)."""
    if name != "fire":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        import fire
    except ImportError:
        fire = None
    globals()["fire"] = fire
    return fire


__getattr__ = _fire_or_none


def create_html_for_group(group_data: dict[str, Any], index: int, open: bool = False) -> str:
    """Render one group as a collapsible HTML block (a fragment of the page).

    Args:
        group_data: a JSONL record with ``messages`` (one entry per sequence: a string or a
            list of ``{role, content}`` turns) and ``scores``; without ``messages``, each
            sequence shows its token count.
        index: the number shown as "Group N".
        open: render the block expanded.

    Returns:
        The HTML block (text rendered from Markdown with raw HTML escaped, scores escaped), or
        ``""`` when the group has no sequence with both a message and a score. When the counts
        differ only the first ``min(len(messages), len(scores))`` sequences are shown.
    """
    return str(render_group_html(group_data, title=f"Group {index}", open=open))


def _page(groups: list[dict[str, Any]], title: str, skipped: int) -> str:
    blocks = []
    for group in groups:
        block = create_html_for_group(group, len(blocks) + 1, open=not blocks)
        if block:
            blocks.append(block)
    return render_page(blocks, title=title, stats=pooled_stats(groups), skipped=skipped)


def render_groups(groups: list[dict[str, Any]], title: str = "Rollouts") -> str:
    """Render already-parsed groups (dicts with ``messages`` and/or ``tokens``, and ``scores``).

    Groups without ``messages`` (e.g. written without ``include_messages``) show token counts so
    the page still lists every score.
    """
    return _page(groups, title, 0)


def generate_html(input_path: str | Path, output_path: str | Path | None = None) -> Path:
    """Convert a JSONL file of groups to a self-contained HTML page.

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
    input_path = Path(input_path)
    if not input_path.is_file():
        raise FileNotFoundError(f"{input_path} does not exist; pass a JSONL file of groups")
    output_path = Path(output_path) if output_path else input_path.with_suffix(".html")
    groups: list[dict[str, Any]] = []
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
            groups.append(record)
    page = _page(groups, input_path.name, skipped)
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


__all__ = [
    "SCRIPT_DIR",
    "TEMPLATE_FILE",
    "create_html_for_group",
    "generate_html",
    "get_score_class",
    "main",
    "render_groups",
]


if __name__ == "__main__":
    main()
