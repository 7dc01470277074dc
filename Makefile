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
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

## The main job: set up, then SFT -> reward model -> PPO (and GRPO) on a synthetic task (~1-2 min on CPU).
## Each run gets its own directory under runs/, so nothing is overwritten.
quickstart: $(STAMP)
	$(BIN)/rlhfkit quickstart --output-dir runs/quickstart-$$(date +%Y%m%d-%H%M%S)

## The algorithm core alone: four algorithms on a bandit with a known optimum (seconds).
demo: $(STAMP)
	$(BIN)/rlhfkit demo

## The default test suite (slow tests excluded), with coverage of the algorithm core.
test: $(STAMP)
	$(BIN)/python -m pytest -q --cov=rlhfkit.algorithms --cov-report=term-missing:skip-covered

## Slow tests only.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) .pytest_cache .coverage build *.egg-info
