"""The documentation site: it builds with ``mkdocs build --strict`` and its defaults tables
come from the code. (tests/test_docs.py runs the python blocks of every page, the cookbook's
included.)

The site needs the ``docs`` extra (``make docs`` installs it). Without mkdocs the build test is
skipped, except under ``CI=true``, where a missing tool must fail rather than pass unseen.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from test_docs import ROOT

HOOK = ROOT / "docs" / "hooks" / "defaults.py"


def load_hook() -> ModuleType:
    """docs/hooks/defaults.py, imported from its path (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("docs_hook_defaults", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mkdocs_or_skip() -> str:
    """The mkdocs command; skip without it (fail under CI, where it must be installed)."""
    found = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if found is None:
        reason = "mkdocs is not installed: `make docs` installs the docs extra"
        if os.environ.get("CI", "").strip().lower() in {"true", "1"}:
            pytest.fail(reason + " (CI=true: the site must be built)")
        pytest.skip(reason)
    return found


def test_defaults_table_comes_from_the_code() -> None:
    warnings: list[str] = []
    table = load_hook().table("latencykit.breaker", warnings.append)
    rows = {row.split("|")[1].strip(): row.split("|")[2].strip() for row in table.splitlines()[2:]}
    assert rows["`minimum_calls`"] == "`20`"
    assert rows["`key`"] == "required"
    assert rows["`window_type`"] == '`"count"`'
    assert "| `minimum_calls` | `20` | calls the window must hold before" in table
    assert warnings == []


def test_defaults_marker_is_replaced_and_problems_are_warnings() -> None:
    hook = load_hook()
    warnings: list[str] = []
    page = "# Retry\n\n<!-- defaults: latencykit.retry -->\n\nText.\n"
    rendered = hook.render(page, "retry.md", warnings.append)
    assert "<!-- defaults" not in rendered
    assert "| `max_attempts` | `3` |" in rendered
    assert rendered.endswith("\n\nText.\n")
    assert warnings == []

    # An undocumented parameter and a marker naming nothing fail a strict build (warnings).
    hook.render("<!-- defaults: latencykit.no_such_thing -->\n", "x.md", warnings.append)
    hook.table("latencykit.deadline", warnings.append)  # `seconds` has no Args entry
    assert len(warnings) == 2, warnings
    assert "no_such_thing" in warnings[0]
    assert "'seconds' has no description" in warnings[1]


def test_docstring_parsing() -> None:
    hook = load_hook()
    doc = """Summary.

    Args:
        first (int): one. Two.
        *rest: several, e.g. ``a``
            and more (see :func:`~latencykit.errors.is_transient`. Really).
        a, b: both.

    Returns:
        nothing: not an argument.
    """
    found = hook.arguments(doc)
    assert set(found) == {"first", "rest", "a", "b"}
    assert hook.first_sentence(found["first"]) == "one."
    assert hook.markdown(hook.first_sentence(found["rest"])) == (
        "several, e.g. `a` and more (see `is_transient`. Really)."
    )


@pytest.mark.slow
@pytest.mark.timeout(300)  # importing the API for the reference takes a while on 2 cores
def test_site_builds_strict(tmp_path: Path) -> None:
    mkdocs = mkdocs_or_skip()
    done = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "site"
    breaker = (site / "breaker" / "index.html").read_text(encoding="utf-8")
    assert "<!-- defaults" not in breaker and "minimum_calls" in breaker
    assert (site / "reference" / "llm" / "index.html").is_file()
    assert "Unreleased" in (site / "changelog" / "index.html").read_text(encoding="utf-8")
