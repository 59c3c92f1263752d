# Two commands on a fresh machine: `make demo` (the latency lab, offline) and `make test`.
# Both bootstrap .venv from nothing (Python >= 3.10 with venv) and then run.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: demo test test-fast lint typecheck unit unit-fast bench docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,lab,docs]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/latencykit lab

# `make test`: everything (about 10 minutes on a loaded 2-core machine). `make test-fast`: the
# daily loop, the same without the tests marked `slow` (processes, soak-like loops, the docs
# site and code blocks, lab runs).
test: lint typecheck unit

test-fast: lint typecheck unit-fast

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest

unit-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/estimator.py
	$(BIN)/python benchmarks/tail.py
	$(BIN)/python benchmarks/failover.py

# The documentation site (mkdocs, material theme, API reference from the docstrings) into site/;
# --strict: a broken link, anchor or docstring reference fails the build.
docs: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .import_linter_cache .pytest_cache lab-results.json site
