# Two commands on a fresh machine: `make demo` (the latency lab, offline) and `make test`.
# Both bootstrap .venv from nothing (Python >= 3.10 with venv) and then run.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: demo test lint typecheck unit bench docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,lab,docs]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/latencykit lab

test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest

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
