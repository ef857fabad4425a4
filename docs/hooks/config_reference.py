"""MkDocs hook: the configuration reference page, generated from the config models at build time.

``reference/config.md`` is not a file in ``docs/``: on every build this hook adds it with the text
``python -m atroposlib.envs.config_docs`` prints, so the page always matches the code.
"""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files

#: Where the generated page lives inside the site (the nav in mkdocs.yml points here).
CONFIG_PAGE = "reference/config.md"


def config_page_text() -> str:
    """Return the Markdown of the configuration reference (every env/server config field)."""
    from atroposlib.envs.config_docs import generate

    return generate()


def on_files(files: Files, config: Any) -> Files:
    """Add the generated configuration reference to the files MkDocs builds."""
    files.append(File.generated(config, CONFIG_PAGE, content=config_page_text()))
    return files
