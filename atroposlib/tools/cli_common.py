"""Command-line plumbing shared by ``atropos-sft-gen`` and ``atropos-dpo-gen`` (flags, run, report)."""

from __future__ import annotations

import argparse
import logging
import random
import sys
from pathlib import Path

from atroposlib.api.client import AtroposClient
from atroposlib.errors import ApiError, ConfigError
from atroposlib.inference.bundled import bundled_model_dir
from atroposlib.tools.collect import CollectStats, collect, dpo_builder, sft_builder
from atroposlib.tools.formats import JsonlOutput, LayoutResolver, OutputFormat, read_existing_layout
from atroposlib.tools.observe import GroupObserver
from atroposlib.tools.rollouts import TokenDecoder
from atroposlib.utils.flags import DEFAULT_API_URL, ArgumentParser, HelpFormatter, api_key_arg

_NOOP = "accepted for compatibility with Atropos 0.4 and ignored: this tool does not register as the trainer"


def build_parser(kind: str) -> argparse.ArgumentParser:
    """The argument parser of ``atropos-sft-gen`` (``kind="sft"``) or ``atropos-dpo-gen`` (``"dpo"``)."""
    sft = kind == "sft"
    parser = ArgumentParser(
        prog="atropos-sft-gen" if sft else "atropos-dpo-gen",
        description=(
            ("Write an SFT dataset (JSONL) from the rollout groups of a running trajectory API, "
             "keeping the best-scored rollouts of each group (rejection sampling).")
            if sft else
            ("Write a DPO preference dataset (JSONL) from the rollout groups of a running "
             "trajectory API, pairing higher- with lower-scored rollouts of the same group.")
        ) + (
            " Groups are read through the API's read-only GET /observe tap, so the tool runs "
            "beside a training run without taking data from the trainer (unlike Atropos 0.4, "
            "it never calls /reset_data or /register). By default lines are conversational "
            "(TRL / Axolotl read them directly); --format legacy writes Atropos 0.4's layout."
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("filepath", nargs="?", default="sft_data.jsonl" if sft else "dpo_data.jsonl",
                        help="output JSONL file")
    parser.add_argument("--api-url", default=DEFAULT_API_URL, help="base URL of run-api")
    parser.add_argument("--api-key", default=None, type=api_key_arg,
                        help="bearer token of run-api (not given: $ATROPOS_API_KEY)")
    parser.add_argument("--tokenizer", default=str(bundled_model_dir()),
                        help="tokenizer (hub id or local dir) used to decode groups that carry only "
                        "token ids; not loaded when groups carry chat messages. The default is the "
                        "bundled SmolLM2-135M-Instruct (atropos-bundled-model prepares it); pass "
                        "the policy's own tokenizer when training another model")
    parser.add_argument("--format", type=OutputFormat, choices=list(OutputFormat),
                        default=OutputFormat.AUTO, metavar="{auto,chat,text,legacy}",
                        help="line layout: chat = conversational messages; text = prompt/"
                        "completion strings decoded from tokens split at the masks; legacy = "
                        "Atropos 0.4's layout; auto = chat when groups carry messages, else text")
    parser.add_argument("--save-messages", action="store_true",
                        help="write chat messages (legacy: the {messages} layout; auto: chat)")
    if sft:
        parser.add_argument("--save-top-n-per-group", type=int, default=3,
                            help="keep at most this many best rollouts per group")
    else:
        parser.add_argument("--save-n-pairs-per-group", type=int, default=3,
                            help="at most this many preference pairs per group")
    parser.add_argument("--num-seqs-to-save", type=int, default=100,
                        help="stop after writing this many lines")
    parser.add_argument("--allow-negative-scores", action="store_true",
                        help="also keep (SFT) or choose (DPO) rollouts with score <= 0")
    parser.add_argument("--minimum-score-diff-max-min", type=float, default=0.0 if sft else 0.5,
                        help=("keep only rollouts scoring more than this above the group's minimum "
                              "(0 = off)") if sft else
                        "chosen must score more than this above rejected")
    parser.add_argument("--append-to-previous", action="store_true",
                        help="append to an existing output file instead of refusing to overwrite it")
    if not sft:
        parser.add_argument("--seed", type=int, default=None,
                            help="seed of the random choice of rejected rollouts, for reproducible output (not "
                            "given: a different choice each run)")
    parser.add_argument("--env-id", type=int, default=None, help="only groups of this env id (not given: every env)")
    parser.add_argument("--after", type=int, default=None,
                        help="only groups after this /observe cursor (not given: from the oldest group "
                        "the API retains); the final report prints the cursor to resume from")
    parser.add_argument("--poll-interval", type=float, default=1.0,
                        help="seconds between polls when no new group is available")
    parser.add_argument("--idle-timeout", type=float, default=None,
                        help="stop after this many seconds without a new group (not given: keep waiting)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--group-size", type=int, default=2, help=_NOOP)
    parser.add_argument("--max-token-len", type=int, default=2048, help=_NOOP)
    if sft:
        parser.add_argument("--tasks-per-step", type=int, default=64, help=_NOOP)
    return parser


def _validate(args: argparse.Namespace, kind: str) -> None:
    per_group = args.save_top_n_per_group if kind == "sft" else args.save_n_pairs_per_group
    flag = "--save-top-n-per-group" if kind == "sft" else "--save-n-pairs-per-group"
    if per_group < 1:
        raise ConfigError(f"{flag} must be >= 1 (got {per_group}); nothing would be written")
    if args.num_seqs_to_save < 1:
        raise ConfigError(f"--num-seqs-to-save must be >= 1 (got {args.num_seqs_to_save})")
    if args.poll_interval <= 0:
        raise ConfigError(f"--poll-interval must be > 0 seconds (got {args.poll_interval})")


def _preflight(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fail at once, with the fix, on a missing ``--tokenizer`` directory or an unreachable run-api.

    The default tokenizer is only needed for token-only groups, so only one given on the
    command line is checked here.
    """
    from atroposlib.utils import preflight as pf

    problems = [pf.check_run_api(args.api_url, "--api-url")]
    if args.tokenizer != parser.get_default("tokenizer"):
        problems.insert(0, pf.check_model_path(args.tokenizer, "--tokenizer", "tokenizer"))
    pf.raise_on_problems(problems)


def run(kind: str, argv: list[str] | None = None) -> int:
    """Parse ``argv``, collect groups from the API and write the dataset.

    Args:
        kind: ``"sft"`` or ``"dpo"``.
        argv: command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        The process exit code: 0 when the target was reached or the idle timeout passed, 1 on
        a configuration or API error, 130 on Ctrl-C (lines written so far are kept).
    """
    parser = build_parser(kind)
    prog = parser.prog
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    stats = CollectStats()
    try:
        _validate(args, kind)
        _preflight(args, parser)
        path = Path(args.filepath)
        existing = read_existing_layout(path, kind) if args.append_to_previous else None
        resolver = LayoutResolver(args.format, save_messages=args.save_messages, existing=existing)
        decoder = TokenDecoder(args.tokenizer)
        if kind == "sft":
            build = sft_builder(decoder, top_n=args.save_top_n_per_group,
                                allow_negative_scores=args.allow_negative_scores,
                                minimum_score_diff_max_min=args.minimum_score_diff_max_min)
        else:
            build = dpo_builder(decoder, n_pairs=args.save_n_pairs_per_group,
                                allow_negative_scores=args.allow_negative_scores,
                                minimum_score_diff_max_min=args.minimum_score_diff_max_min,
                                rng=random.Random(args.seed))
        from tqdm import tqdm

        # No tqdm monitor thread: one bar, drawn from this thread, needs no miniters tuning, and
        # that thread is tqdm's known source of hangs at interpreter exit (tqdm#469, #1751).
        tqdm.monitor_interval = 0
        with (
            JsonlOutput(path, append=args.append_to_previous) as output,
            AtroposClient(args.api_url, api_key=args.api_key) as client,
            tqdm(total=args.num_seqs_to_save, unit="line", disable=args.quiet or None,
                 desc=kind.upper()) as bar,
        ):
            observer = GroupObserver(client, after=args.after, env_id=args.env_id)
            groups = observer.follow(poll_interval=args.poll_interval,
                                     idle_timeout=args.idle_timeout)
            try:
                collect(groups, build, output, resolver, target=args.num_seqs_to_save,
                        progress=bar, stats=stats)
            finally:
                stats.missed_groups = observer.missed
    except KeyboardInterrupt:
        print(f"interrupted; {stats.summary()}", file=sys.stderr)
        return 130
    except (ConfigError, ApiError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        if stats.groups_seen:
            print(f"(before the error: {stats.summary()})", file=sys.stderr)
        return 1
    target = args.filepath if stats.lines_written else "no file written"
    print(f"{prog}: {stats.summary()} -> {target}", file=sys.stderr)
    if stats.lines_written < args.num_seqs_to_save:
        print(f"{prog}: stopped before --num-seqs-to-save {args.num_seqs_to_save} lines "
              f"(no new group for --idle-timeout {args.idle_timeout} s)", file=sys.stderr)
    return 0
