"""Griffe extension for the API reference: Sphinx roles in docstrings, as Markdown code.

The docstrings name other objects the Sphinx way (``:class:`~latencykit.LLM```), which
Markdown would show verbatim. This turns each role into a code span of the name (the last
part only when the target starts with ``~``, as Sphinx shows it), before mkdocstrings renders
the docstring.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:func|class|meth|attr|data|mod|exc|obj):`(~?)([^`]+)`")


def as_code(text: str) -> str:
    """``text`` with every Sphinx role replaced by a Markdown code span."""
    return ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", text)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring once the object tree is built."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring, if it has one."""
        if obj.docstring is not None:
            obj.docstring.value = as_code(obj.docstring.value)
