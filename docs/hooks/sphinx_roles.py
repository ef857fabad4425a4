"""Griffe extension: show the Sphinx roles our docstrings use as Markdown code spans.

Docstrings in this project cross-reference with reStructuredText roles (``:class:`Foo```,
``:func:`~pkg.mod.bar```), which Markdown would print literally. Before mkdocstrings renders a
docstring, this rewrites each role to a code span with the name as Sphinx would show it (the last
dotted part when the target starts with ``~``). Only the rendered docs change, not the code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(~?)([^`<>]+)`")
#: "Example::" introduces a literal block in reStructuredText and reads "Example:".
_LITERAL_INTRO = re.compile(r"(?<=\S)::$", re.M)


def _span(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def rewrite_roles(text: str) -> str:
    """Return ``text`` with every Sphinx role turned into a code span, and ``Example::`` into ``Example:``."""
    return _LITERAL_INTRO.sub(":", _ROLE.sub(_span, text))


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring griffe loads (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring in place, before it is parsed."""
        if obj.docstring is not None:
            obj.docstring.value = rewrite_roles(obj.docstring.value)
