"""Reading Google-style docstrings: the descriptions of a callable's arguments.

One parser for the places that show an option's description from its docstring: the config
models (:mod:`latencykit.config`) and the docs site's defaults tables (docs/hooks/defaults.py).
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Iterator

__all__ = ["SECTIONS", "arguments"]

SECTIONS = ("Args:", "Arguments:", "Parameters:", "Attributes:")
"""The sections read, for functions and classes (``Args:``) and dataclasses (``Attributes:``)."""


def _entries(doc: str, sections: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """``(name, description)`` of each entry of the given sections of a docstring: a section
    runs while its lines are indented deeper than its header (blank lines included), and an
    entry starts at the section's shallowest indent."""
    header = "|".join(re.escape(section) for section in sections)
    section = re.compile(rf"^( *)(?:{header}) *\n((?:\1 +\S.*\n|[ \t]*\n)*)", re.MULTILINE)
    for found in section.finditer(doc + "\n"):
        for entry in re.split(r"\n(?=\S)", textwrap.dedent(found[2]).strip()):
            head, _, text = entry.partition(":")
            yield head, " ".join(text.split())


def arguments(doc: str | None, sections: tuple[str, ...] = SECTIONS) -> dict[str, str]:
    """The parameter descriptions of a Google-style docstring, by parameter name.

    An entry ``name (type): text`` counts as ``name``; ``*args`` as ``args``; ``a, b: text``
    describes both ``a`` and ``b``. Sections: ``Args:``, ``Arguments:``, ``Parameters:`` and,
    for dataclasses, ``Attributes:`` (``Args:`` wins when both describe a name).
    """
    found: dict[str, str] = {}
    for head, text in _entries(inspect.cleandoc(doc or ""), sections):
        for part in head.split(","):
            name = part.split("(")[0].strip().lstrip("*")
            if name.isidentifier():
                found.setdefault(name, text)
    return found
