"""Reading Google-style docstrings: the descriptions of a callable's arguments.

One parser for the places that show an option's description from its docstring: the config
models (:mod:`latencykit.config`) and the docs site's defaults tables (docs/hooks/defaults.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

__all__ = ["SECTIONS", "arguments"]

SECTIONS = ("Args:", "Arguments:", "Parameters:", "Attributes:")
"""The sections read, for functions and classes (``Args:``) and dataclasses (``Attributes:``)."""


def _entries(lines: list[str], sections: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """``(name, description)`` of each entry of the given sections of a docstring."""
    i = 0
    while i < len(lines):
        header = lines[i].strip()
        if header not in sections:
            i += 1
            continue
        base = len(lines[i]) - len(lines[i].lstrip())
        i += 1
        name, text = "", list[str]()
        entry_indent: int | None = None
        while i < len(lines):
            line = lines[i]
            indent = len(line) - len(line.lstrip())
            if line.strip() and indent <= base:
                break  # the section is over
            if entry_indent is None and line.strip():
                entry_indent = indent
            if line.strip() and indent == entry_indent:
                if name:
                    yield name, " ".join(text)
                head, _, rest = line.strip().partition(":")
                name, text = head, [rest.strip()]
            elif line.strip():
                text.append(line.strip())
            i += 1
        if name:
            yield name, " ".join(text)


def arguments(doc: str | None, sections: tuple[str, ...] = SECTIONS) -> dict[str, str]:
    """The parameter descriptions of a Google-style docstring, by parameter name.

    An entry ``name (type): text`` counts as ``name``; ``*args`` as ``args``; ``a, b: text``
    describes both ``a`` and ``b``. Sections: ``Args:``, ``Arguments:``, ``Parameters:`` and,
    for dataclasses, ``Attributes:`` (``Args:`` wins when both describe a name).
    """
    found: dict[str, str] = {}
    for head, text in _entries(inspect.cleandoc(doc or "").splitlines(), sections):
        for part in head.split(","):
            name = part.split("(")[0].strip().lstrip("*")
            if name.isidentifier():
                found.setdefault(name, text)
    return found
