"""view-run's rendering of observed rollout groups, through the shared renderer in :mod:`atroposlib.frontend.render`.

``jsonl2html`` (and the ``process`` command's HTML) use the same renderer, templates and
stylesheet, so a rollout reads the same in both views: Markdown rendered, HTML written by the
model shown literally as text (escaped, never stripped or run).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from markupsafe import Markup

from atroposlib.frontend.render import CSS, render_groups_html, render_markdown
from atroposlib.tools.observe import ObservedGroup
from atroposlib.tools.rollouts import TokenDecoder


def _title_meta(observed: ObservedGroup) -> tuple[str, list[str]]:
    when = time.strftime("%H:%M:%S", time.localtime(observed.received_at)) if observed.received_at else "?"
    env = "no env id" if observed.env_id is None else f"env {observed.env_id}"
    return f"Group #{observed.cursor}", [env, f"received {when}"]


def render_group(observed: ObservedGroup, decoder: TokenDecoder | None = None) -> Markup:
    """HTML of one group: a collapsible block with its rollouts, best score first.

    A prompt shared by every rollout (the usual case) is shown once, above the completions, and
    the reference answer when the group carries one.

    Args:
        observed: the group and its /observe metadata.
        decoder: decodes groups that carry only tokens (None: show token counts).

    Returns:
        An HTML fragment; every piece of rollout text is escaped or rendered from Markdown with
        raw HTML disabled.
    """
    title, meta = _title_meta(observed)
    return render_groups_html([(observed.group, title, meta)], decoder)


def render_groups(groups: Sequence[ObservedGroup], decoder: TokenDecoder | None = None,
                  empty_message: str = "No groups yet.", summary_label: str | None = None) -> Markup:
    """HTML of several groups (in the given order), or an empty-state note.

    Args:
        groups: the groups to show.
        decoder: see :func:`render_group`.
        empty_message: shown (escaped) when ``groups`` is empty.
        summary_label: when set, a summary line (mean score, share correct, completion lengths)
            over all shown groups comes first, labelled with it.
    """
    items: list[tuple[dict[str, Any], str, list[str]]] = [(g.group, *_title_meta(g)) for g in groups]
    return render_groups_html(items, decoder, summary_label=summary_label, empty_message=empty_message)


__all__ = ["CSS", "render_group", "render_groups", "render_markdown"]
