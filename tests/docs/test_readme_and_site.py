"""README.md stays a short front page whose links land on real pages of the documentation site."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def test_readme_is_at_most_300_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail into a page under docs/"


def test_readme_keeps_the_install_and_test_commands():
    text = README.read_text()
    assert "```bash\nmake install\n```" in text and "```bash\nmake test\n```" in text
    assert "```bash\nmake quickstart" in text


def test_readme_links_point_at_files_that_exist():
    links = [m.group(1) for m in LINK.finditer(README.read_text()) if "://" not in m.group(1)]
    assert links, "README.md should link into docs/"
    missing = [link for link in links if not (REPO / link).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_readme_sections_the_site_includes_are_marked():
    """docs/ pages include README sections (pymdownx.snippets); the markers must be there."""
    text = README.read_text()
    included = set()
    for page in (REPO / "docs").rglob("*.md"):
        included |= set(re.findall(r'^--8<-- "README\.md:(\w+)"$', page.read_text(), re.M))
    assert included, "the site includes README sections (install, quickstart, test)"
    for name in included:
        assert f"<!-- --8<-- [start:{name}] -->" in text and f"<!-- --8<-- [end:{name}] -->" in text


def test_the_grafana_dashboard_uses_only_documented_metrics():
    import json
    import re

    docs = REPO / "docs"
    dashboard = json.loads((docs / "grafana" / "atropos.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    used = {re.sub(r"_(bucket|sum|count)$", "", n) for e in exprs for n in re.findall(r"atropos_\w+", e)}
    documented = set(re.findall(r"`(atropos_\w+)`", (docs / "metrics.md").read_text()
                                + (docs / "metrics-trainer.md").read_text()))
    assert {part for n in used for part in ("api", "trainer", "env", "inference")
            if n.startswith(f"atropos_{part}_")} == {"api", "trainer", "env", "inference"}
    assert used <= documented, used - documented
