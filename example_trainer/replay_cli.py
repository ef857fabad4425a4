"""``atropos-replay``: verify and re-drive a GRPO run's steps from its replay bundles.

::

    atropos-replay verify RUN_DIR [--step N | --all] [--rtol X]
    atropos-replay train RUN_DIR [--out trace.jsonl]

Both run on the CPU with no run-api, inference server or env: the bundles
(:mod:`example_trainer.bundles`) hold every batch the trainer consumed, and the checkpoints
(or the run's starting model) the weights to start from (:mod:`example_trainer.redrive`).
Exit status: 0 when everything held, 1 when a stage diverged (``verify``) or a loss differs
(``train``), 2 for bad flags or a run that cannot be re-driven. Guide: docs/guides/replay.md.
"""

from __future__ import annotations

import sys


def build_parser() -> object:
    """The ``atropos-replay`` parser (subcommands ``verify`` and ``train``)."""
    from atroposlib.utils.flags import ArgumentParser

    parser = ArgumentParser(
        prog="atropos-replay",
        description="Verify and re-drive a GRPO run's steps from the replay bundles it recorded "
        "(<run_dir>/bundles), without run-api, an inference server or an env. Guide: "
        "docs/guides/replay.md.")
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
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console script ``atropos-replay``; returns the exit status (see the module docstring)."""
    from example_trainer import redrive
    from example_trainer.bundles import BundleError

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)  # type: ignore[attr-defined]
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


if __name__ == "__main__":
    raise SystemExit(main())
