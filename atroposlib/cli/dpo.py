"""``atropos-dpo-gen``: write a DPO preference dataset from a running API's rollout groups."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``atropos-dpo-gen``; see ``atropos-dpo-gen --help``."""
    from atroposlib.tools.cli_common import run

    return run("dpo", argv)


if __name__ == "__main__":
    sys.exit(main())
