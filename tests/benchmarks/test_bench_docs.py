"""Published benchmark figures come from result files: `make bench-docs` regenerates them, and a
figure edited by hand, or one whose result file is gone, fails here."""

from __future__ import annotations

import re
import shutil

import pytest

from benchmarks import bench_docs, docs_tables
from benchmarks.results import RESULTS_DIR, ROOT

#: a figure: a percentage, a ratio, or an amount of memory or time
FIGURE = re.compile(r"\d+(?:\.\d+)?(?:x\b|\s*(?:%|GiB|MiB|GB|MB|s/step|tok/s|tokens/s|groups/s|ms\b))")


def _outside_blocks(text: str) -> str:
    """``text`` without its generated blocks and fenced code (commands may hold numbers)."""
    spans = bench_docs.blocks_in(text)
    kept, last = [], 0
    for _, start, end in spans:
        kept.append(text[last:start])
        last = end
    kept.append(text[last:])
    return re.sub(r"```.*?```", "", "".join(kept), flags=re.S)


def test_every_generated_block_matches_its_result_files():
    for page in bench_docs.PAGES:
        text = page.read_text()
        assert bench_docs.blocks_in(text, page.name), f"{page.name} has no generated blocks"
        assert bench_docs.rewrite(text, page=page.name) == text, (
            f"{page.relative_to(ROOT)} differs from its result files: run `make bench-docs`")
    assert bench_docs.main(["--check"]) == 0


def test_every_block_is_published_somewhere():
    published = {name for page in bench_docs.PAGES for name, _, _ in bench_docs.blocks_in(page.read_text())}
    assert published == set(bench_docs.BLOCKS), "a block nobody publishes, or a page naming an unknown block"


def test_the_benchmarks_page_has_no_figure_outside_a_generated_block():
    text = _outside_blocks((ROOT / "docs" / "benchmarks.md").read_text())
    assert FIGURE.findall(text) == []


def test_the_readme_has_no_benchmark_figure_outside_a_generated_block():
    # the install section's sizes and minutes describe the install, not a benchmark
    text = (ROOT / "README.md").read_text()
    text = re.sub(r"<!-- --8<-- \[start:install\] -->.*?<!-- --8<-- \[end:install\] -->", "", text, flags=re.S)
    assert FIGURE.findall(_outside_blocks(text)) == []


def test_a_figure_edited_by_hand_is_caught(tmp_path):
    page = ROOT / "docs" / "benchmarks.md"
    text = page.read_text()
    name, start, end = next(b for b in bench_docs.blocks_in(text) if b[0] == "fair-d2")
    figure = re.search(r"\*\*(\d+\.\d)%\*\*", text[start:end])
    assert figure, "the fair-d2 table lost its bold final accuracy"
    edited = text[:start] + text[start:end].replace(figure.group(0), "**99.9%**", 1) + text[end:]
    assert bench_docs.rewrite(edited, page="edited") != edited
    assert bench_docs.rewrite(edited, page="edited") == text


def test_a_deleted_result_file_fails_the_block_that_publishes_it(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(RESULTS_DIR, results, ignore=shutil.ignore_patterns("*.png"))
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert bench_docs.rewrite(text, results, "benchmarks.md") == text
    (results / bench_docs.FAIR_D4).unlink()
    with pytest.raises(bench_docs.MissingResult, match=bench_docs.FAIR_D4):
        bench_docs.rewrite(text, results, "benchmarks.md")
    assert bench_docs.main(["--check", "--results", str(results)]) == 1


def test_a_block_reading_a_pattern_fails_when_no_file_matches(tmp_path):
    with pytest.raises(bench_docs.MissingResult, match="trainer-gpu"):
        bench_docs.render("trainer-gpu", tmp_path)


@pytest.mark.parametrize("broken, message", [
    ("<!-- bench:quickstart start -->\nx\n", "start without its end"),
    ("x\n<!-- bench:quickstart end -->\n", "end without its start"),
    ("<!-- bench:nope start -->\n<!-- bench:nope end -->\n", "unknown block"),
    ("<!-- bench:quickstart start -->\n<!-- bench:quickstart end -->\n" * 2, "twice"),
])
def test_broken_markers_are_named(broken, message):
    with pytest.raises(ValueError, match=message):
        bench_docs.rewrite(broken, page="p")


def test_ranges_give_their_count_and_selections_say_so():
    assert docs_tables.span([0.848, 0.876, 0.857], docs_tables.pct) == "84.8-87.6% (n=3)"
    assert docs_tables.span([0.5], docs_tables.pct) == "50.0% (n=1)"
    d4 = bench_docs.render("runs-d4")
    assert d4.count("a selection") == 1
    assert "a selection" in bench_docs.render("readme-d4")
