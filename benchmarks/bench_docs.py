"""Write the published benchmark figures from the result files: ``make bench-docs``.

Every table and figure in ``docs/benchmarks.md`` and the README's benchmark sentences sits
between two markers::

    <!-- bench:NAME start -->
    ...generated text...
    <!-- bench:NAME end -->

This script renders each block ``NAME`` from the files in ``benchmarks/results/`` it names
(:data:`BLOCKS`) and rewrites the text between the markers. ``--check`` rewrites nothing and
exits 1 when a block differs from what it would write, or when a block's result file is
missing. A test runs the check, so a figure edited by hand, or one whose file was deleted,
fails the suite.

Usage::

    python -m benchmarks.bench_docs            # rewrite docs/benchmarks.md and README.md
    python -m benchmarks.bench_docs --check    # exit 1 if anything would change
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.docs_outcomes import (  # noqa: E402
    FAULT_CURVE,
    FEATURE_SCREEN,
    LORA_SYNC,
    PACE,
    PRECISION,
    WASTE,
    fault_curve_table,
    feature_screen_table,
    lora_sync_table,
    pace_table,
    precision_table,
    waste_table,
)
from benchmarks.docs_sync import DELTA_SYNC, delta_sync_table  # noqa: E402
from benchmarks.docs_tables import (  # noqa: E402
    API,
    COMPAT,
    CONSTANT,
    COSINE,
    FAIR_D2,
    FAIR_D4,
    HEALTH,
    LORA_TRL_FULL,
    MEMORY_LORA,
    MEMORY_LORA_HF,
    MEMORY_VLLM_FP32,
    PARITY,
    QUICKSTART,
    QUICKSTART_D4,
    RELOAD,
    SCREEN,
    SCREEN_COST,
    SCREEN_WEIGHTED,
    SIGNAL,
    STEP_MEMORY,
    SWEEP_D2,
    SWEEP_D4,
    VERIFIERS,
    api_table,
    compat_table,
    d4_goal,
    errors_table,
    fair_table,
    health_table,
    memory_hf_table,
    memory_lora_table,
    memory_table,
    parity_table,
    quickstart_table,
    readme_api,
    readme_d4,
    readme_quickstart,
    reload_table,
    screen_table,
    settings_table,
    signal_table,
    step_memory_table,
    sweep_table,
    trainer_gpu_table,
    verifiers_table,
)
from benchmarks.results import RESULTS_DIR, ROOT, read_result  # noqa: E402

#: the pages whose blocks this script owns
PAGES = (ROOT / "docs" / "benchmarks.md", ROOT / "README.md", ROOT / "docs" / "guides" / "compatibility.md",
         ROOT / "docs" / "guides" / "ecosystems.md")
MARKER = re.compile(r"<!-- bench:(?P<name>[a-z0-9-]+) (?P<end>start|end) -->")


class MissingResult(Exception):
    """A block's result file is not in the results folder."""


@dataclass(frozen=True)
class Block:
    """One generated block: the result files it reads and how it renders them.

    Attributes:
        files: file names in the results folder, in the order ``render`` receives them.
        render: ``render(*payloads) -> markdown`` (no surrounding blank lines).
        pattern: with a non-empty value, ``files`` is ignored and the block reads every file
            whose name matches this regular expression, as one ``{name: payload}`` argument.
    """

    files: tuple[str, ...]
    render: Callable[..., str]
    pattern: str = ""


BLOCKS: dict[str, Block] = {
    "readme-quickstart": Block((QUICKSTART, FAIR_D2, FAIR_D4, LORA_TRL_FULL, MEMORY_LORA, MEMORY_LORA_HF),
                               readme_quickstart),
    "readme-d4": Block((COSINE, QUICKSTART_D4), readme_d4),
    "quickstart": Block((QUICKSTART,), quickstart_table),
    "fair-d2": Block((FAIR_D2,), fair_table(FAIR_D2)),
    "fair-d4": Block((FAIR_D4,), fair_table(FAIR_D4)),
    "sweep-d2": Block((SWEEP_D2,), sweep_table(SWEEP_D2)),
    "sweep-d4": Block((SWEEP_D4,), sweep_table(SWEEP_D4)),
    "memory-lora": Block((MEMORY_LORA,), memory_lora_table(MEMORY_LORA)),
    "memory-lora-hf": Block((MEMORY_LORA_HF, MEMORY_VLLM_FP32), memory_hf_table),
    "memory-trl": Block((LORA_TRL_FULL, FAIR_D2), memory_table),
    "d4-goal": Block((COSINE, CONSTANT, QUICKSTART_D4), d4_goal),
    "runs-d4": Block((), settings_table(4, 14.0), pattern=r"^bench_learning_.*\.json$"),
    "runs-d2": Block((), settings_table(2, 14.0), pattern=r"^bench_learning_.*\.json$"),
    "screen": Block((SCREEN,), screen_table(SCREEN)),
    "screen-weighted": Block((SCREEN_WEIGHTED,), screen_table(SCREEN_WEIGHTED)),
    "screen-cost": Block((SCREEN_COST,), screen_table(SCREEN_COST)),
    "screen-signal": Block((SIGNAL,), signal_table),
    "screen-features": Block((FEATURE_SCREEN,), feature_screen_table),
    "arithmetic-errors": Block(("bench_arithmetic_errors_d4policy_2026-11-29.json",), errors_table),
    "step-memory": Block(STEP_MEMORY, lambda *p: step_memory_table(*p, names=STEP_MEMORY)),
    "reload-logprobs": Block(RELOAD, lambda *p: reload_table(*p, names=RELOAD)),
    "trainer-gpu": Block((), trainer_gpu_table, pattern=r"^bench_trainer_gpu_.*\.json$"),
    "api": Block((API,), api_table),
    "readme-api": Block((API,), readme_api),
    "compat-upstream": Block((COMPAT,), compat_table),
    "vllm-health": Block((HEALTH,), health_table),
    "fault-curve": Block((FAULT_CURVE,), fault_curve_table),
    "pace": Block(PACE, pace_table),
    "lora-sync": Block(LORA_SYNC, lora_sync_table),
    "precision": Block(PRECISION, precision_table),
    "waste": Block(WASTE, waste_table),
    "delta-sync": Block((DELTA_SYNC,), delta_sync_table),
    "upstream-suite": Block((PARITY,), parity_table),
    "verifiers-envs": Block((VERIFIERS,), verifiers_table),
}


# ---------------------------------------------------------------- rendering and rewriting


def render(name: str, results_dir: Path = RESULTS_DIR) -> str:
    """The text of block ``name`` from the files in ``results_dir``.

    Raises:
        KeyError: no block of that name.
        MissingResult: a file the block reads is missing (or, for a pattern, none matches).
    """
    block = BLOCKS[name]
    if block.pattern:
        names = sorted(p.name for p in results_dir.iterdir() if re.match(block.pattern, p.name))
        if not names:
            raise MissingResult(f"block {name!r}: no file matching {block.pattern!r} in {results_dir}")
        return block.render({n: read_result(results_dir / n) for n in names}).strip()
    missing = [f for f in block.files if not (results_dir / f).is_file()]
    if missing:
        raise MissingResult(f"block {name!r} publishes figures from {', '.join(missing)}, which "
                            f"{'is' if len(missing) == 1 else 'are'} not in {results_dir}: restore the "
                            "file, or remove the block from the page")
    return block.render(*(read_result(results_dir / f) for f in block.files)).strip()


def blocks_in(text: str, page: str = "page") -> list[tuple[str, int, int]]:
    """``(name, start, end)`` of each block: the offsets of the text between its two markers.

    Raises:
        ValueError: a marker without its partner, nested blocks, or a name used twice.
    """
    found, open_name, open_at, seen = [], None, 0, set()
    for match in MARKER.finditer(text):
        name, is_end = match["name"], match["end"] == "end"
        if not is_end:
            if open_name is not None:
                raise ValueError(f"{page}: bench:{name} starts inside bench:{open_name}")
            if name in seen:
                raise ValueError(f"{page}: bench:{name} appears twice")
            open_name, open_at = name, match.end()
        else:
            if open_name != name:
                raise ValueError(f"{page}: bench:{name} end without its start")
            found.append((name, open_at, match.start()))
            seen.add(name)
            open_name = None
    if open_name is not None:
        raise ValueError(f"{page}: bench:{open_name} start without its end")
    return found


def rewrite(text: str, results_dir: Path = RESULTS_DIR, page: str = "page") -> str:
    """``text`` with every block replaced by its rendering.

    Raises:
        ValueError: a block name :data:`BLOCKS` does not know, or unbalanced markers.
        MissingResult: see :func:`render`.
    """
    out, last = [], 0
    for name, start, end in blocks_in(text, page):
        if name not in BLOCKS:
            raise ValueError(f"{page}: unknown block bench:{name}; known: {', '.join(BLOCKS)}")
        out += [text[last:start], "\n", render(name, results_dir), "\n"]
        last = end
    return "".join(out) + text[last:]


def main(argv: list[str] | None = None) -> int:
    """Rewrite the pages, or with ``--check`` report what would change (exit 1)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page is stale")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="the result files' folder")
    args = parser.parse_args(argv)
    stale = []
    for page in PAGES:
        text = page.read_text()
        try:
            new = rewrite(text, args.results, str(page.relative_to(ROOT)))
        except (MissingResult, ValueError) as exc:
            print(f"[bench-docs] {exc}", file=sys.stderr)
            return 1
        if new != text:
            stale.append(page)
            if not args.check:
                page.write_text(new)
    for page in stale:
        print(f"[bench-docs] {'stale' if args.check else 'rewrote'}: {page.relative_to(ROOT)}",
              file=sys.stderr if args.check else sys.stdout)
    if args.check and stale:
        print("[bench-docs] run `make bench-docs` to regenerate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
