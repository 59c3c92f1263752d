"""What a user installs: ``python -m build`` makes the sdist and, from it, the wheel; the wheel
installed into a fresh venv, next to exactly its declared runtime requirements (no dev extra),
runs every example offline and finds its package data.

Offline throughout: the build uses the backend installed in this venv (``--no-isolation``, the
dev extra has ``build`` and ``hatchling``), pip installs only the wheel (``--no-index
--no-deps``), and the requirements are this venv's own distributions, shown to the fresh venv
file by file through a ``.pth`` (so a requirement missing from pyproject.toml fails the test).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from test_examples import CHECKS, run_example

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # a build, a venv, a process per example

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "latencykit"
# The package data named in the docs: the fleet's Lua scripts, the lab's shipped trace, PEP 561.
SCRIPTS = sorted(path.stem for path in (PACKAGE / "fleet").glob("*.lua"))
DATA = [
    "latencykit/py.typed",
    *(f"latencykit/fleet/{name}.lua" for name in SCRIPTS),
    "latencykit/testing/data/llmperf_per_request.csv",
    "latencykit/testing/data/ATTRIBUTION.md",
]


def run(*command: str | Path, env: dict[str, str] | None = None) -> str:
    """Run ``command`` (it must exit 0); its standard output."""
    done = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel, as ``python -m build`` makes them (the wheel from the sdist)."""
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT)
    return out


def wheel_of(dist: Path) -> Path:
    (wheel,) = dist.glob("latencykit-*.whl")
    return wheel


def package_files() -> list[str]:
    """Every file of the package in the source tree, as ``latencykit/...``."""
    return sorted(
        path.relative_to(PACKAGE.parent).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    )


def test_the_wheel_holds_the_package_and_its_data(dist: Path) -> None:
    names = set(zipfile.ZipFile(wheel_of(dist)).namelist())
    assert set(DATA) <= names
    assert set(package_files()) <= names
    assert not [name for name in names if "__pycache__" in name or name.startswith("tests/")]


def test_the_sdist_holds_what_a_rebuild_needs(dist: Path) -> None:
    (sdist,) = dist.glob("latencykit-*.tar.gz")
    with tarfile.open(sdist) as archive:
        top, *_ = archive.getnames()[0].split("/")
        names = {name.removeprefix(f"{top}/") for name in archive.getnames()}
    needed = {"pyproject.toml", "README.md", "PKG-INFO"}
    assert needed | {f"src/{name}" for name in package_files()} <= names


def runtime_requirements(wheel: Path) -> list[metadata.Distribution]:
    """The distributions of this venv that the wheel's runtime requirements need, transitively
    (markers evaluated here, no extra of latencykit's; a requirement's own extras followed)."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        declared = Parser().parsestr(archive.read(name).decode()).get_all("Requires-Dist") or []
    direct = [Requirement(text) for text in declared]
    todo = [req for req in direct if req.marker is None or req.marker.evaluate({"extra": ""})]
    found: dict[str, metadata.Distribution] = {}
    followed: set[tuple[str, str]] = set()  # (distribution, extra): "" is its base requirements
    for req in todo:
        distribution = metadata.distribution(req.name)
        if req in direct:  # latencykit's own pins hold for what this venv runs
            assert req.specifier.contains(distribution.version, prereleases=True), req
        key = canonicalize_name(req.name)
        found[key] = distribution
        extras = {extra for extra in {"", *req.extras} if (key, extra) not in followed}
        followed |= {(key, extra) for extra in extras}
        for text in distribution.requires or [] if extras else []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                todo.append(sub)
    return list(found.values())


def link_files(distributions: list[metadata.Distribution], into: Path) -> None:
    """Link every installed file of ``distributions`` into ``into`` (a site-packages layout)."""
    for distribution in distributions:
        files = distribution.files
        assert files is not None, f"{distribution.metadata['Name']} lists no files (no RECORD)"
        for file in files:
            if file.parts[0] == "..":  # scripts in bin/: not importable
                continue
            link = into / file
            if not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(Path(str(distribution.locate_file(file))).resolve())


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed and only its runtime requirements importable; its
    ``python``."""
    home = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", "--without-pip", home)
    python = home / "bin" / "python"
    # --isolated: no pip configuration (its find-links and extra indexes) applies.
    run(sys.executable, "-m", "pip", "--isolated", "--python", python, "install", "--quiet",
        "--no-index", "--no-deps", wheel_of(dist))  # fmt: skip
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    requirements = home / "requirements"
    link_files(runtime_requirements(wheel_of(dist)), requirements)
    (site / "requirements.pth").write_text(f"{requirements}\n")
    return python


def clean_env() -> dict[str, str]:
    """This environment without Python's own variables (no ``PYTHONPATH`` into the sources)."""
    return {name: value for name, value in os.environ.items() if not name.startswith("PYTHON")}


def test_the_venv_has_the_wheel_and_no_dev_extra(venv: Path) -> None:
    found = run(venv, "-I", "-c", "import latencykit, litellm; print(latencykit.__file__)")
    assert found.startswith(str(venv.parent.parent / "lib"))
    for dev_only in ("pytest", "redis", "trio", "opentelemetry.sdk", "matplotlib"):
        missing = subprocess.run(
            [venv, "-I", "-c", f"import {dev_only}"], capture_output=True, check=False
        )
        assert missing.returncode != 0, f"{dev_only} is importable in the fresh venv"


def test_the_installed_package_reads_its_data(venv: Path) -> None:
    read = (
        "from importlib.resources import files\n"
        "import latencykit.fleet, latencykit.testing\n"
        f"for name in {SCRIPTS!r}:\n"
        "    assert 'redis.call' in files(latencykit.fleet).joinpath(name + '.lua').read_text()\n"
        "from latencykit.testing import LlmperfProfile\n"
        "print(len(LlmperfProfile.runs()))\n"
    )
    assert int(run(venv, "-I", "-c", read, env=clean_env())) > 1
    # The console script, and the config schema the docs publish, from the installed package.
    assert "together/13b" in run(venv.parent / "latencykit", "lab", "--list-runs", env=clean_env())
    published = (ROOT / "docs" / "latencykit-config.schema.json").read_text()
    assert run(venv, "-m", "latencykit.config", env=clean_env()).strip() == published.strip()


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_examples_run_from_the_installed_wheel(venv: Path, name: str) -> None:
    CHECKS[name](run_example(name, python=str(venv), env=clean_env()))
