"""mkdocs hook: defaults tables generated from the code, so that they cannot drift from it.

A page line ``<!-- defaults: latencykit.breaker -->`` (an HTML comment: invisible where the
Markdown is read as is, on GitHub) is replaced, in the built site, by a table of that callable's
parameters: name, default (from ``inspect.signature``) and the first sentence of its
description in the docstring's ``Args:`` (or, for a dataclass, ``Attributes:``) section.

A parameter without a description, an ``Args:`` entry naming no parameter, and a marker naming
nothing importable are logged as warnings, which fail ``mkdocs build --strict``: the docstring
is then the thing to fix.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import json
import logging
import re
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from latencykit._docstrings import arguments

log = logging.getLogger("mkdocs.hooks.defaults")  # under "mkdocs": counted by --strict

MARKER = re.compile(r"^<!-- defaults: ([\w.]+) -->[ \t]*$", re.MULTILINE)
# ":func:`~latencykit.errors.is_transient`" and friends: Sphinx roles, written as code here.
ROLE = re.compile(r":(?:func|class|meth|attr|data|mod|exc|obj):`(~?)([^`]+)`")
ABBREVIATIONS = ("e.g", "i.e", "etc", "vs", "cf")


def resolve(path: str) -> Any:
    """The object a dotted path names: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"no module in {path!r}")


def first_sentence(text: str) -> str:
    """The first sentence of ``text``: up to the first period that is followed by a space or
    ends the text, outside parentheses and code, and not that of an abbreviation."""
    depth, code = 0, False
    for i, char in enumerate(text):
        if char == "`":
            code = not code
        elif code:
            continue
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif (
            char == "."
            and depth == 0
            and (i + 1 == len(text) or text[i + 1] == " ")
            and not text[:i].endswith(ABBREVIATIONS)
        ):
            return text[: i + 1]
    return text


def markdown(text: str) -> str:
    """reStructuredText-flavoured docstring text as Markdown fit for a table cell."""
    text = ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`", text)
    text = re.sub(r"``(.+?)``", r"`\1`", text)
    return text.replace("|", "\\|")


def _public_name(obj: Any) -> str:
    """``anyio.sleep`` rather than ``anyio._core._eventloop.sleep``: the shortest module path
    that exports the object under its own name."""
    qualname = getattr(obj, "__qualname__", None)
    module = getattr(obj, "__module__", None)
    if not qualname or not module:
        return repr(obj)
    parts = module.split(".")
    for cut in range(1, len(parts) + 1):
        prefix = ".".join(parts[:cut])
        try:
            if getattr(importlib.import_module(prefix), qualname, None) is obj:
                return f"{prefix}.{qualname}"
        except ImportError:
            break
    return f"{module}.{qualname}"


def default_text(default: Any) -> str:
    """How a parameter's default reads in the table."""
    if default is inspect.Parameter.empty:
        return "required"
    if isinstance(default, MappingProxyType):
        default = dict(default)
    if isinstance(default, enum.Enum):
        shown = f"{type(default).__name__}.{default.name}"
    elif inspect.isroutine(default) or inspect.isclass(default):
        shown = _public_name(default)
    elif isinstance(default, str):
        shown = json.dumps(default)  # "count", as the pages write strings
    else:
        shown = repr(default)
    return "`" + shown.replace("|", "\\|") + "`"


def _defaults(obj: Any) -> dict[str, Any]:
    """The defaults a dataclass computes with ``default_factory`` (the signature shows
    ``<factory>`` for them)."""
    if not dataclasses.is_dataclass(obj):
        return {}
    return {
        field.name: field.default_factory()
        for field in dataclasses.fields(obj)
        if field.default_factory is not dataclasses.MISSING
    }


def table(path: str, warn: Callable[[str], None] = log.warning) -> str:
    """The Markdown table of the parameters of the callable at ``path``.

    For a class, the parameters of its constructor, described by the class docstring (or,
    failing that, by the docstring of ``__init__``).
    """
    obj = resolve(path)
    signature = inspect.signature(obj)
    factories = _defaults(obj)
    described = arguments(obj.__doc__)
    if inspect.isclass(obj) and not described:
        described = arguments(obj.__init__.__doc__)
    rows = ["| option | default | description |", "|---|---|---|"]
    for name, parameter in signature.parameters.items():
        if parameter.kind is parameter.VAR_POSITIONAL:
            shown, default = f"*{name}", "none"
        elif parameter.kind is parameter.VAR_KEYWORD:
            shown, default = f"**{name}", "none"
        else:
            shown, default = name, default_text(factories.get(name, parameter.default))
        text = described.get(name)
        if text is None:
            warn(
                f"defaults table of {path}: parameter {name!r} has no description in its docstring"
            )
            text = ""
        rows.append(f"| `{shown}` | {default} | {markdown(first_sentence(text))} |")
    # Attributes may describe more than the parameters; Args may not.
    args = arguments(obj.__doc__, sections=("Args:", "Arguments:", "Parameters:"))
    for name in sorted(set(args) - set(signature.parameters)):
        warn(f"defaults table of {path}: the docstring describes {name!r}, not a parameter")
    return "\n".join(rows)


def render(markdown_text: str, where: str = "", warn: Callable[[str], None] = log.warning) -> str:
    """``markdown_text`` with every defaults marker replaced by its table."""

    def replace(match: re.Match[str]) -> str:
        path = match[1]
        try:
            rows = table(path, warn)
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            warn(f"{where}: defaults marker {path!r}: {exc}")
            return match[0]
        # A collapsed block: the page's own table stays the first read; this one is exact.
        body = "\n".join("    " + row for row in rows.splitlines())
        return f'??? info "Defaults of `{path}`, from its signature and docstring"\n\n{body}\n'

    return MARKER.sub(replace, markdown_text)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs event: replace the markers of each page before it is rendered."""
    return render(markdown, where=page.file.src_uri)
