# Every target builds its own virtual environment from a bare Python on first use.
#   make test   — all tests (tiny random models + `slow` ones on the embedded SmolLM2)
#   make lint   — ruff + the import layers (lint-imports)
#   make demo   — the main job on the embedded default (label → fit → eval) on CPU
#   make kvpress-test — lkv presses inside NVIDIA kvpress (own env: kvpress pins transformers<5.3, pandas<3)
#   make test-lowest  — the fast tests on the lowest dependency versions pyproject allows
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# `pip install torch==2.13.0` resolves to a local CPU wheel on machines that ship one and to the
# regular PyPI (CUDA) build elsewhere. Override for other builds, e.g.
#   make TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" test
TORCH ?= torch==2.13.0

KVPRESS_VENV ?= .venv-kvpress
LOWEST_VENV ?= .venv-lowest

.PHONY: install test test-fast lint demo clean kvpress-env kvpress-test lowest-env test-lowest

$(BIN)/.lkv-installed: pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -c requirements/constraints.txt -e '.[dev]'
	touch $@

install: $(BIN)/.lkv-installed

test: install
	$(BIN)/python -m pytest -m "slow or not slow" -q

test-fast: install
	$(BIN)/python -m pytest -q

# style, then the stage layers of pyproject's import-linter contracts (docs/design.md)
lint: install
	$(BIN)/ruff check lkv tests scripts
	$(BIN)/ruff format --check lkv tests scripts
	$(BIN)/lint-imports

demo: install
	$(BIN)/lkv demo --config configs/demo/smollm2_135m.yaml

# lkv[kvpress] in its own environment, pinned by requirements/kvpress.txt (transformers 5.2, pandas 2);
# tests/integrations/ skip themselves wherever kvpress is not installed.
$(KVPRESS_VENV)/bin/.lkv-installed: pyproject.toml requirements/kvpress.txt
	$(PYTHON) -m venv $(KVPRESS_VENV)
	$(KVPRESS_VENV)/bin/python -m pip install -q --upgrade pip
	$(KVPRESS_VENV)/bin/python -m pip install -q $(TORCH)
	$(KVPRESS_VENV)/bin/python -m pip install -q -c requirements/kvpress.txt -e '.[dev,kvpress]'
	touch $@

kvpress-env: $(KVPRESS_VENV)/bin/.lkv-installed

# KVPRESS_TESTS='-m "not slow"' skips the real-model needle test (it trains an adapter: minutes)
KVPRESS_TESTS ?= -m "slow or not slow"
kvpress-test: kvpress-env
	$(KVPRESS_VENV)/bin/python -m pytest tests/integrations $(KVPRESS_TESTS) -q

# The lowest version of every direct dependency that pyproject allows (requirements/lowest.txt; torch stays
# $(TORCH): the lowest CPU build is not on this machine's index), then the fast tests.
$(LOWEST_VENV)/bin/.lkv-installed: pyproject.toml requirements/lowest.txt
	$(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOWEST_VENV)/bin/python -m pip install -q $(TORCH)
	$(LOWEST_VENV)/bin/python -m pip install -q -c requirements/lowest.txt -e '.[dev]'
	touch $@

lowest-env: $(LOWEST_VENV)/bin/.lkv-installed

test-lowest: lowest-env
	$(LOWEST_VENV)/bin/python -m pytest -q

clean:
	rm -rf $(VENV) $(KVPRESS_VENV) $(LOWEST_VENV) *.egg-info
