"""``atropos-replay``: verify and re-drive a GRPO run's steps from its replay bundles.

::

    atropos-replay verify RUN_DIR [--step N | --all] [--rtol X]
    atropos-replay train RUN_DIR [--out trace.jsonl]
    atropos-replay rescore RUN_DIR --env NAME [--step N | --all] [--set KEY=VALUE] [--setup] [--json OUT]

``verify`` and ``train`` run on the CPU with no run-api, inference server or env: the bundles
(:mod:`example_trainer.bundles`) hold every batch the trainer consumed, and the checkpoints
(or the run's starting model) the weights to start from (:mod:`example_trainer.redrive`).
``rescore`` runs an env's scorer on the recorded completions (:mod:`example_trainer.rescore`).
Exit status: 0 when everything held, 1 when a stage diverged (``verify``), a loss differs
(``train``) or a score changed (``rescore``), 2 for bad flags or a run that cannot be
re-driven or rescored. Guide: docs/guides/replay.md.
"""

from __future__ import annotations

import sys


def build_parser() -> object:
    """The ``atropos-replay`` parser (subcommands ``verify``, ``train`` and ``rescore``)."""
    from atroposlib.utils.flags import ArgumentParser

    parser = ArgumentParser(
        prog="atropos-replay",
        description="Verify and re-drive a GRPO run's steps from the replay bundles it recorded "
        "(<run_dir>/bundles), without run-api, an inference server or an env, or score its "
        "recorded completions again with an env's scorer. Guide: docs/guides/replay.md.")
    sub = parser.add_subparsers(dest="command", required=True)
    verify = sub.add_parser(
        "verify", help="recompute advantages, loss, gradient norm and weights of recorded steps "
        "and name the first stage that diverges",
        description="Re-drive recorded steps from the nearest checkpoint before them and check, "
        "in order: bundle checksum, advantages, loss, gradients, weights. Exit 1 names the "
        "first stage that diverges.")
    verify.add_argument("run_dir", help="the run directory (holding bundles/ and checkpoints/)")
    which = verify.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, action="append", help="verify this step (repeatable)")
    which.add_argument("--all", action="store_true", help="verify every step with a bundle (the default)")
    verify.add_argument("--rtol", type=float, default=0.0, help="relative tolerance of loss, "
                        "gradient norm and weights (0: bit for bit, which holds on the recording CPU)")
    verify.add_argument("--torch-threads", type=int, default=None,
                        help="torch threads (default: the recorded count; another count changes "
                        "reduction order, so set --rtol)")
    train = sub.add_parser(
        "train", help="re-drive the trainer through every recorded step and compare the loss trace",
        description="Re-drive every recorded step from the bundles alone (from the starting "
        "model, or the nearest checkpoint before the oldest kept bundle) and compare each "
        "step's loss with the recorded one, exactly. Exit 1 when a loss differs.")
    train.add_argument("run_dir", help="the run directory (holding bundles/)")
    train.add_argument("--out", default=None, help="write the re-driven loss trace here (JSON lines)")
    train.add_argument("--torch-threads", type=int, default=None, help="torch threads (default: the recorded count)")
    rescore = sub.add_parser(
        "rescore", help="run an env's scorer on the recorded completions and report which scores "
        "changed",
        description="Score every completed member of the recorded batches again with the env's "
        "scorer, from the dataset item each group carries: no policy, no inference server. The "
        "env's rescore_group(item, group) decides: a SingleTurnEnv's score(item, completion), a "
        "MultiTurnEnv's score_episode(item, messages) on the recorded transcript, an Atropos "
        "0.4-style env's score(rollout_group_data) on member dicts rebuilt from the record. Exit "
        "1 when a score changed, 2 for bad input (including an env that cannot score recorded "
        "groups: the message names the method to implement).")
    rescore.add_argument("run_dir", help="the run directory (holding bundles/)")
    rescore.add_argument("--env", required=True, metavar="NAME",
                         help="the env: a name from `atropos-env list` (e.g. gsm8k) or module:Class")
    steps = rescore.add_mutually_exclusive_group()
    steps.add_argument("--step", type=int, action="append", help="rescore this step (repeatable)")
    steps.add_argument("--all", action="store_true", help="rescore every step with a bundle (the default)")
    rescore.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="override a setting of the env's config_init() defaults (repeatable; "
                         "VALUE is JSON or text), e.g. --set answer_format=boxed")
    rescore.add_argument("--setup", action="store_true",
                         help="run the env's setup() first, for a scorer that uses what setup builds "
                         "(it may load the env's dataset)")
    rescore.add_argument("--json", default=None, metavar="OUT",
                         help="also write the report (every changed member, totals) to OUT as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console script ``atropos-replay``; returns the exit status (see the module docstring)."""
    from example_trainer import redrive
    from example_trainer.bundles import BundleError

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)  # type: ignore[attr-defined]
    if args.command == "rescore":
        return _rescore(args)
    if args.torch_threads is not None and args.torch_threads < 1:
        print("atropos-replay: --torch-threads must be >= 1 (or left out: the recorded count)", file=sys.stderr)
        return 2
    try:
        if args.command == "verify":
            if args.rtol < 0:
                print("atropos-replay: --rtol must be >= 0 (0: bit for bit)", file=sys.stderr)
                return 2
            failed = redrive.verify(args.run_dir, args.step, rtol=args.rtol, torch_threads=args.torch_threads)
            return 1 if failed is not None else 0
        trace = redrive.train(args.run_dir, torch_threads=args.torch_threads, out=args.out)
    except redrive.ReplayError as exc:
        print(f"atropos-replay: {exc}", file=sys.stderr)
        return 2
    except BundleError as exc:
        print(f"atropos-replay: {exc}", file=sys.stderr)
        return 1
    differ = [r for r in trace if r.stage is not None]
    if differ:
        print(f"replay train: {len(differ)} of {len(trace)} step losses differ from the recording; "
              f"first at step {differ[0].step}: {differ[0].detail}")
        return 1
    print(f"replay train: {len(trace)} steps, loss trace identical to the recording")
    return 0


def _rescore(args: object) -> int:
    """``atropos-replay rescore``: 0 when no score changed, 1 when some did, 2 for bad input."""
    from example_trainer.rescore import RescoreError, parse_settings, rescore

    try:
        results = rescore(args.run_dir, args.env, args.step, parse_settings(args.set),  # type: ignore[attr-defined]
                          out=args.json, setup=args.setup)  # type: ignore[attr-defined]
    except RescoreError as exc:
        print(f"atropos-replay: {exc}", file=sys.stderr)
        return 2
    return 1 if any(r.changed for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
