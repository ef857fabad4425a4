"""``atropos-sft-gen``: write an SFT dataset from a running API's rollout groups (rejection sampling)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``atropos-sft-gen``; see ``atropos-sft-gen --help``."""
    from atroposlib.tools.cli_common import run

    return run("sft", argv)


if __name__ == "__main__":
    sys.exit(main())
