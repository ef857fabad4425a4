"""``view-run``: a local Gradio page showing the groups arriving at a running trajectory API.

It never registers as the trainer, never resets the API and never
opens a public share link: it tails the read-only ``GET /observe`` cursor, so it can watch a live
training run. Rollout text is rendered as markdown and sanitised (rollouts are untrusted).

Example::

    view-run --api-url http://127.0.0.1:8000 --tokenizer ~/.cache/atroposlib/bundled/SmolLM2-135M-Instruct
    # then open http://127.0.0.1:9001
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Any

from atroposlib.utils.flags import DEFAULT_API_URL, ArgumentParser, HelpFormatter, api_key_arg

_NOOP = "accepted for compatibility with Atropos 0.4 and ignored: view-run does not register"
_ALL = "all envs"
_NO_ENV = "no env id"
NEWEST = "newest first"
BEST = "mean score: high to low"
WORST = "mean score: low to high"
#: The choices of the sort dropdown.
SORTS = (NEWEST, BEST, WORST)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``view-run``."""
    parser = ArgumentParser(
        prog="view-run",
        description="Show the rollout groups arriving at a running trajectory API in a local web "
        "page (Gradio): chat messages, scores, summary statistics, a per-env filter, sorting and "
        "filtering by mean score, refresh and auto refresh. Reads "
        "the API's read-only GET /observe tap, so it does not take data from the trainer.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--api-url", default=DEFAULT_API_URL, help="base URL of run-api")
    parser.add_argument("--api-key", default=None, type=api_key_arg,
                        help="bearer token of run-api (not given: $ATROPOS_API_KEY)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="interface the page listens on (the page has no login: keep it local)")
    parser.add_argument("--port", type=int, default=9001, help="port of the page")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer (hub id or local dir) to decode groups that carry no chat "
                        "messages (not given: token counts are shown)")
    parser.add_argument("--refresh-seconds", type=float, default=2.0,
                        help="auto-refresh period of the page")
    parser.add_argument("--max-groups", type=int, default=200,
                        help="most recent groups kept in memory by the viewer")
    parser.add_argument("--after", type=int, default=0,
                        help="start after this /observe cursor (0: the oldest group the API retains)")
    parser.add_argument("--group-size", type=int, default=2, help=_NOOP)
    parser.add_argument("--max-token-len", type=int, default=2048, help=_NOOP)
    return parser


def _env_filter(choice: str | None) -> tuple[bool, int | None]:
    """Map a dropdown choice to (filter on, env id)."""
    if not choice or choice == _ALL:
        return False, None
    if choice == _NO_ENV:
        return True, None
    return True, int(choice.removeprefix("env "))


def _bound(value: Any) -> float | None:
    """A score bound from the UI's text box: None, blank or NaN mean "no bound".

    Raises:
        ValueError: the text is not a number.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    value = float(value)
    return None if math.isnan(value) else value


def sort_and_filter(groups: Sequence[Any], sort: str = NEWEST, min_score: float | None = None,
                    max_score: float | None = None) -> list[Any]:
    """Order and filter groups by their mean score (a pure function of its arguments).

    Args:
        groups: :class:`~atroposlib.tools.observe.ObservedGroup` (anything with a ``.group``
            dict holding ``scores``), newest first.
        sort: one of :data:`SORTS`: keep the given (newest first) order, or order by mean
            score, high to low or low to high; ties keep the given order.
        min_score: keep only groups whose mean score is ``>= min_score`` (None: no bound).
        max_score: keep only groups whose mean score is ``<= max_score`` (None: no bound).
            With a bound set, groups without a numeric score are dropped; without one they are
            kept, and sorting puts them last.

    Returns:
        A new list; ``groups`` is not modified.

    Raises:
        ValueError: ``sort`` is not one of :data:`SORTS`.
    """
    from atroposlib.frontend.render import group_stats

    if sort not in SORTS:
        raise ValueError(f"sort must be one of {list(SORTS)}, got {sort!r}")
    means = [group_stats(g.group).mean_score for g in groups]
    keep = [
        (g, m) for g, m in zip(groups, means, strict=True)
        if (min_score is None and max_score is None)
        or (m is not None and (min_score is None or m >= min_score)
            and (max_score is None or m <= max_score))
    ]
    if sort != NEWEST:
        sign = -1.0 if sort == BEST else 1.0
        keep.sort(key=lambda gm: (gm[1] is None, 0.0 if gm[1] is None else sign * gm[1]))
    return [g for g, _ in keep]


def refresh_view(
    feed: Any, decoder: Any, api_url: str, env_choice: str | None, shown: float,
    sort: str = NEWEST, min_score: Any = None, max_score: Any = None,
) -> tuple[list[str], str, str, str]:
    """Pull new groups and render the page state (pure Python: no Gradio objects).

    Args:
        feed: a :class:`~atroposlib.tools.observe.RecentGroups`.
        decoder: a :class:`~atroposlib.tools.rollouts.TokenDecoder` or None.
        api_url: shown in the status line.
        env_choice: the env dropdown's value (``"all envs"``, ``"env N"`` or ``"no env id"``).
        shown: how many groups to show (after sorting and filtering).
        sort: the sort dropdown's value (see :func:`sort_and_filter`).
        min_score: lower bound of the mean-score filter (None or empty: no bound).
        max_score: upper bound of the mean-score filter (None or empty: no bound).

    Returns:
        ``(env_choices, env_value, status_markdown, groups_html)``.
    """
    from atroposlib.frontend.observed import render_groups

    feed.refresh()
    filtered, env_id = _env_filter(env_choice)
    everything = feed.snapshot()
    problems = []
    bounds = []
    for label, raw in (("min", min_score), ("max", max_score)):
        try:
            bounds.append(_bound(raw))
        except ValueError:
            bounds.append(None)
            problems.append(f"{label} score {str(raw)[:40]!r} is not a number: ignored")
    lo, hi = bounds
    sort = sort if sort in SORTS else NEWEST
    matching = sort_and_filter([g for g in everything if not filtered or g.env_id == env_id],
                               sort, lo, hi)
    groups = matching[: max(1, int(shown))]
    choices = [_ALL] + [_NO_ENV if i is None else f"env {i}" for i in feed.env_ids()]
    value = env_choice if env_choice in choices else _ALL
    status = f"{len(everything)} groups received · showing {len(groups)} · API {api_url}"
    if lo is not None or hi is not None:
        status += f" · {len(matching)} match the mean-score filter"
        if lo is not None and hi is not None and lo > hi:
            status += " (min score is above max score: nothing can match)"
    for problem in problems:
        status += f" · {problem}"
    if feed.observer.missed:
        status += (f" · {feed.observer.missed} groups left the API's retention window before "
                   "they could be shown")
    if feed.last_error:
        status += f" · **API error:** {feed.last_error}"
    empty = "No groups yet: waiting for environments to POST /scored_data."
    body = render_groups(groups, decoder, empty_message=empty, summary_label="Shown groups")
    return choices, value, status, str(body)


def build_ui(feed: Any, decoder: Any = None, *, api_url: str = "", refresh_seconds: float = 2.0) -> Any:
    """Build the Gradio Blocks page over a :class:`~atroposlib.tools.observe.RecentGroups` feed.

    Args:
        feed: the group window (``refresh()``, ``snapshot()``, ``env_ids()``, ``last_error``).
        decoder: a :class:`~atroposlib.tools.rollouts.TokenDecoder` for token-only groups, or None.
        api_url: shown in the header.
        refresh_seconds: auto-refresh period (the "Auto refresh" checkbox toggles it).

    Returns:
        A ``gradio.Blocks`` (call ``.launch(css=CSS, ...)``).
    """
    import gradio as gr  # lazy: heavy import

    def update(env_choice: str | None, shown: float, sort: str, lo: Any, hi: Any) -> tuple[Any, str, str]:
        choices, value, status, body = refresh_view(feed, decoder, api_url, env_choice, shown,
                                                     sort, lo, hi)
        return gr.Dropdown(choices=choices, value=value), status, body

    with gr.Blocks(title="Atropos run viewer", analytics_enabled=False) as demo:
        gr.Markdown("## Atropos run viewer")
        with gr.Row():
            env = gr.Dropdown(choices=[_ALL], value=_ALL, label="Environment", interactive=True)
            shown = gr.Slider(1, 200, value=20, step=1, label="Groups shown")
            auto = gr.Checkbox(value=True, label=f"Auto refresh every {refresh_seconds:g} s")
            refresh = gr.Button("Refresh", variant="primary")
        with gr.Row():
            sort = gr.Dropdown(choices=list(SORTS), value=NEWEST, label="Sort", interactive=True)
            # text, not gr.Number: an empty Number box reaches the server as 0 from a browser
            lo = gr.Textbox(value="", label="Min mean score (empty: none)", placeholder="e.g. 0.5")
            hi = gr.Textbox(value="", label="Max mean score (empty: none)", placeholder="e.g. 1")
        status = gr.Markdown(elem_id="atr-status")
        view = gr.HTML(elem_id="atr-groups")
        timer = gr.Timer(refresh_seconds, active=True)
        inputs, outputs = [env, shown, sort, lo, hi], [env, status, view]
        refresh.click(update, inputs, outputs, api_name="refresh")
        # a slow refresh must not pile up ticks: keep only the latest pending one
        timer.tick(update, inputs, outputs, show_progress="hidden", trigger_mode="always_last")
        for control in (env, sort, lo, hi):
            control.change(update, inputs, outputs)
        demo.load(update, inputs, outputs)
        auto.change(lambda on: gr.Timer(active=on), auto, timer)
    return demo


def preflight_problems(args: argparse.Namespace) -> list[str]:
    """What keeps ``view-run`` from starting, one line each with its fix (empty: nothing).

    Checked in seconds, before Gradio is imported: a ``--tokenizer`` path that does not exist,
    a ``--port`` already in use, and a run-api that does not answer at ``--api-url``.
    """
    from atroposlib.utils import preflight as pf

    problems = [
        pf.check_model_path(args.tokenizer, "--tokenizer", "tokenizer") if args.tokenizer else None,
        pf.check_port_free(args.host, args.port, f"another view-run? stop it or pass --port {args.port + 1}"),
        pf.check_run_api(args.api_url, "--api-url"),
    ]
    return [p for p in problems if p]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``view-run``; see ``view-run --help``."""
    args = build_parser().parse_args(argv)
    if args.refresh_seconds <= 0:
        print("view-run: error: --refresh-seconds must be > 0", file=sys.stderr)
        return 2
    problems = preflight_problems(args)
    if problems:
        print("\n".join(f"view-run: error: {p}" for p in problems), file=sys.stderr)
        return 2
    from atroposlib.api.client import AtroposClient
    from atroposlib.frontend.render import CSS
    from atroposlib.tools.observe import GroupObserver, RecentGroups
    from atroposlib.tools.rollouts import TokenDecoder

    client = AtroposClient(args.api_url, api_key=args.api_key, max_attempts=2, max_retry_seconds=5)
    observer = GroupObserver(client, after=args.after or None)
    feed = RecentGroups(observer, max_groups=args.max_groups)
    decoder = TokenDecoder(args.tokenizer) if args.tokenizer else None
    if decoder is not None:  # load it now, not inside the first page refresh
        try:
            _ = decoder.tokenizer
        except Exception as exc:  # noqa: BLE001 - the page shows token counts instead
            print(f"view-run: warning: {exc}", file=sys.stderr)
    feed.refresh()
    demo = build_ui(feed, decoder, api_url=args.api_url, refresh_seconds=args.refresh_seconds)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"view-run: warning: listening on {args.host}: the page has no login, so anyone who "
              "can reach it reads the rollouts", file=sys.stderr)
    print(f"view-run: watching {args.api_url} on http://{args.host}:{args.port}", file=sys.stderr)
    demo.queue(default_concurrency_limit=1).launch(
        server_name=args.host, server_port=args.port, share=False, css=CSS, ssr_mode=False,
        footer_links=[], quiet=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
