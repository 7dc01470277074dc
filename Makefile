# Every target sets itself up from a fresh clone with nothing installed but Python 3.10+.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel of torch is installed first and pinned, so no dependency pulls a CUDA build.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: quickstart demo test test-slow coverage clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

## The main job: set up, then run the demo of the algorithm core.
quickstart: $(STAMP)
	$(BIN)/rlhfkit demo

demo: quickstart

## The default test suite (slow tests excluded), with coverage of the algorithm core.
test: $(STAMP)
	$(BIN)/python -m pytest -q --cov=rlhfkit.algorithms --cov-report=term-missing:skip-covered

## Slow tests only.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) .pytest_cache .coverage build *.egg-info
