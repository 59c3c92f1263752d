"""Every fenced ``python`` block of README.md and docs/*.md runs, for real, offline.

How a block runs (the test id is ``file:line`` of its opening fence):

- a block that defines ``test_*`` functions is a pytest module: it is written to a temporary
  file and run by pytest in a subprocess (latencykit's pytest plugin is loaded there, as for a
  user);
- any other block is a program, executed in a fresh namespace (``__name__ == "__main__"``).
  Top-level ``await``, ``async with`` and ``async for`` are allowed, as in ``python -m
  asyncio``: such a block runs in ``asyncio.run``. Provider calls go to one shared fake provider
  on 127.0.0.1: the examples leave the endpoint and key to litellm, which reads them from the
  environment (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``), and this module sets both.

A block fails its test if it raises or exits non-zero. A marker on the line before a fence
(an HTML comment: invisible on the rendered page) changes how the block runs:

- ``<!-- docs-test: continue -->``: the block continues the previous python block of the same
  file (it uses names defined there) and runs joined to it;
- ``<!-- docs-test: skip: <why> -->``: not run. The reason is required; skips stay few.

Other blocks are not run. In ``sh`` blocks the ``make`` targets and the scripts named must
exist; a documented ``python -m latencykit...`` command line may only use options its
``--help`` lists.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import os
import re
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import latencykit as lk
from latencykit.testing import FakeProvider

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MAX_SKIPS = 2  # a skipped block is an untested example: keep them rare

FENCE = re.compile(r"^( *)```(\S*)\s*$")  # a fence may be indented (in a list item)
MARKER = re.compile(r"^<!-- docs-test: (continue|skip: (.*\S)) -->$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its code and its marker."""

    path: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    lang: str
    code: str  # dedented
    marker: str | None  # "continue", "skip: <why>" or None
    previous: Block | None  # the previous python block of the same file

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def program(self) -> str:
        """The code to run: the block after the blocks it continues, each on its own lines of
        the Markdown file (blank lines between), so that tracebacks point into the file."""
        before = ""
        if self.marker == "continue":
            assert self.previous is not None, f"{self.id}: 'continue' needs an earlier block"
            before = self.previous.program
        return before + "\n" * (self.line - before.count("\n")) + self.code


def read_blocks(path: Path, root: Path = ROOT) -> Iterator[Block]:
    """The fenced blocks of one Markdown file, in order. A marker is the last non-blank line
    before the fence."""
    lines = path.read_text(encoding="utf-8").splitlines()
    previous: Block | None = None
    above = ""
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            above = lines[i].strip() or above
            i += 1
            continue
        indent, lang = opening[1], opening[2]
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(f"{indent}```"))
        marked = MARKER.match(above)
        block = Block(
            path=path.relative_to(root).as_posix(),
            line=i + 1,
            lang="python" if lang == "py" else lang,
            code=textwrap.dedent("\n".join(lines[i + 1 : end]) + "\n"),
            marker=marked[1] if marked else None,
            previous=previous,
        )
        assert marked or not above.startswith("<!-- docs-test"), f"{block.id}: bad marker"
        if block.lang == "python":
            previous = block
        yield block
        above = ""
        i = end + 1


BLOCKS = [block for path in DOCS for block in read_blocks(path)]
PYTHON = [block for block in BLOCKS if block.lang == "python"]
SHELL = [block for block in BLOCKS if block.lang in ("sh", "bash", "console", "shell")]


def is_pytest_module(code: str) -> bool:
    tree = ast.parse(code)
    return any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
        for node in tree.body
    )


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    """One fake provider for every block; the examples find it through the environment.

    litellm's first request in a process blocks the event loop for 0.5-1 s (more on a loaded
    machine), where no deadline can preempt it (docs/concepts.md, "Cold start"): one request
    here keeps that out of the examples' budgets, as a warm-up at start-up does in a server.
    """
    import litellm

    with FakeProvider() as fake:
        warm_up = litellm.acompletion(
            model="openai/warm-up",
            api_base=fake.base_url,
            api_key="fake-key",
            max_retries=0,
            messages=[{"role": "user", "content": "hi"}],
        )
        asyncio.run(warm_up)
        yield fake


def shift_lines(code: types.CodeType, lines: int) -> types.CodeType:
    """``code``, and the functions and classes it defines, ``lines`` lines further down."""
    consts = tuple(
        shift_lines(const, lines) if isinstance(const, types.CodeType) else const
        for const in code.co_consts
    )
    return code.replace(co_firstlineno=code.co_firstlineno + lines, co_consts=consts)


def run_program(block: Block) -> None:
    """Execute a block as ``__main__`` in a fresh namespace, on asyncio if it awaits."""
    program = block.program.lstrip("\n")
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    code = compile(program, ROOT / block.path, "exec", flags=flags, dont_inherit=True)
    # Line numbers in the Markdown file; tracebacks show the code, not the text above it.
    code = shift_lines(code, len(block.program) - len(program))
    namespace = {"__name__": "__main__"}
    try:
        result = eval(code, namespace)
        if asyncio.iscoroutine(result):  # top-level await: the block is a coroutine's body
            asyncio.run(result)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            pytest.fail(f"{block.id} exited with {exc.code!r}")


def run_pytest_module(block: Block, directory: Path) -> None:
    """Write the block to a test file and run pytest on it in a subprocess."""
    test_file = directory / "test_doc_block.py"
    test_file.write_text(block.program, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file.name],
        cwd=directory,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert done.returncode == 0, f"{block.id}: pytest failed\n{done.stdout}\n{done.stderr}"


@pytest.mark.slow
@pytest.mark.timeout(180)  # generous: a loaded 2-core machine imports litellm slowly
@pytest.mark.parametrize("block", PYTHON, ids=lambda block: block.id)
def test_python_block_runs(
    block: Block, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if block.marker and block.marker.startswith("skip: "):
        pytest.skip(block.marker)
    if is_pytest_module(block.program):
        run_pytest_module(block, tmp_path)
        return
    monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "fake-key")
    # Safety net: a failover to Anthropic would reach the fake provider (and fail), never the
    # internet.
    monkeypatch.setenv("ANTHROPIC_BASE_URL", provider.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "fake-key")
    # Breakers are process-wide: blocks and other tests must not share them.
    lk.policies.breaker.reset_breakers()
    try:
        run_program(block)
    finally:
        lk.policies.breaker.reset_breakers()


def test_skips_are_few_and_explained() -> None:
    skipped = [block for block in PYTHON if block.marker and block.marker.startswith("skip")]
    assert len(skipped) <= MAX_SKIPS, [block.id for block in skipped]
    assert PYTHON, "no python block found"


@pytest.mark.parametrize("block", SHELL, ids=lambda block: block.id)
def test_shell_block_names_what_exists(block: Block) -> None:
    """``make`` targets exist in the Makefile; scripts named by path exist."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w-]+):", makefile, flags=re.MULTILINE))
    for line in block.code.splitlines():
        command = line.split("#", 1)[0].split()
        if command[:1] == ["make"]:
            assert set(command[1:]) <= targets, f"{block.id}: {line!r}"
        for word in command:
            if word.endswith(".py"):
                assert (ROOT / word).is_file(), f"{block.id}: {word} does not exist"


CLI = [block for block in BLOCKS if block.lang != "python" and "python -m latencykit" in block.code]


@pytest.mark.parametrize("block", CLI, ids=lambda block: block.id)
def test_cli_block_options_exist(block: Block) -> None:
    """A documented ``python -m latencykit...`` command line uses options its --help lists."""
    module = re.search(r"python -m (latencykit[\w.]*)", block.code)
    assert module is not None
    done = subprocess.run(
        [sys.executable, "-m", module[1], "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    options = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", block.code))
    assert options <= set(re.findall(r"--[a-z][\w-]*", done.stdout)), block.id


SAMPLE = """\
# Sample

```python
x = 1
```

<!-- docs-test: continue -->
```python
assert x == 1
```

1. In a list:

   <!-- docs-test: skip: needs a GPU -->
   ```py
   import torch
   ```

```sh
make test
```
"""


def test_runner_reads_markers_and_joins_continued_blocks(tmp_path: Path) -> None:
    (tmp_path / "sample.md").write_text(SAMPLE, encoding="utf-8")
    first, second, third, shell = read_blocks(tmp_path / "sample.md", root=tmp_path)
    assert [b.id for b in (first, second, third, shell)] == [
        "sample.md:3",
        "sample.md:8",
        "sample.md:15",
        "sample.md:19",
    ]
    assert (first.marker, second.marker, third.marker) == (None, "continue", "skip: needs a GPU")
    assert (third.lang, third.code, shell.lang) == ("python", "import torch\n", "sh")
    assert second.program.splitlines()[3:] == ["x = 1", "", "", "", "", "assert x == 1"]
    run_program(second)  # the continued block sees the names of the first

    (tmp_path / "bad.md").write_text("<!-- docs-test: skip -->\n```python\n```\n", "utf-8")
    with pytest.raises(AssertionError, match="bad marker"):
        list(read_blocks(tmp_path / "bad.md", root=tmp_path))
    with pytest.raises(pytest.fail.Exception, match="exited with 2"):
        run_program(dataclasses.replace(first, code="raise SystemExit(2)\n"))
    with pytest.raises(ZeroDivisionError):
        run_program(dataclasses.replace(first, code="import anyio\nawait anyio.sleep(0)\n1 / 0\n"))
