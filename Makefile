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
comma := ,

KVPRESS_VENV ?= .venv-kvpress
LOWEST_VENV ?= .venv-lowest
# pyproject's torch bound. PyPI has no CPU-only 2.4 build for Linux: this is the CUDA one (~3 GB to download,
# ~5 GB installed with its nvidia-* libraries), which also runs on CPU.
LOWEST_TORCH ?= torch==2.4.0

.PHONY: install test test-fast lint demo clean kvpress-env kvpress-test lowest-env test-lowest

# One environment: venv, pip, torch ($(4), else $(TORCH)), then lkv with extras $(3) under the pins of $(2).
#   $(call lkv_env,FOLDER,PINS,EXTRAS[,TORCH])
define lkv_env
$(1)/bin/.lkv-installed: pyproject.toml $(2)
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q $(or $(4),$(TORCH))
	$(1)/bin/python -m pip install -q -c $(2) -e '.[$(3)]'
	touch $$@
endef

$(eval $(call lkv_env,$(VENV),requirements/constraints.txt,dev))

install: $(BIN)/.lkv-installed

# Tests run in $(TEST_WORKERS) pytest-xdist workers, one thread each, a test file per worker (its module
# fixtures are built once); --durations prints the slowest tests, so every CI log shows where its minutes go.
TEST_WORKERS ?= 2
PYTEST_PARALLEL = OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile
test: install
	$(PYTEST_PARALLEL) -m "slow or not slow" -q --durations=30

test-fast: install
	$(PYTEST_PARALLEL) -q

# style, then the stage layers of pyproject's import-linter contracts (docs/design.md)
lint: install
	$(BIN)/ruff check lkv tests scripts
	$(BIN)/ruff format --check lkv tests scripts
	$(BIN)/lint-imports

demo: install
	$(BIN)/lkv demo --config configs/demo/smollm2_135m.yaml

# lkv[kvpress] in its own environment, pinned by requirements/kvpress.txt (transformers 5.2, pandas 2);
# tests/integrations/ skip themselves wherever kvpress is not installed.
$(eval $(call lkv_env,$(KVPRESS_VENV),requirements/kvpress.txt,dev$(comma)kvpress))

kvpress-env: $(KVPRESS_VENV)/bin/.lkv-installed

# KVPRESS_TESTS='-m "not slow"' skips the real-model needle test (it trains an adapter: minutes)
KVPRESS_TESTS ?= -m "slow or not slow"
kvpress-test: kvpress-env
	$(KVPRESS_VENV)/bin/python -m pytest tests/integrations $(KVPRESS_TESTS) -q

# The lowest version of every direct dependency that pyproject allows (requirements/lowest.txt, torch
# $(LOWEST_TORCH)), then ruff (its bound is the style's) and the fast tests (tests/test_layers.py runs lint-imports).
$(eval $(call lkv_env,$(LOWEST_VENV),requirements/lowest.txt,dev,$(LOWEST_TORCH)))

lowest-env: $(LOWEST_VENV)/bin/.lkv-installed

test-lowest: lowest-env
	$(LOWEST_VENV)/bin/ruff check lkv tests scripts
	$(LOWEST_VENV)/bin/ruff format --check lkv tests scripts
	$(LOWEST_VENV)/bin/python -m pytest -q

clean:
	rm -rf $(VENV) $(KVPRESS_VENV) $(LOWEST_VENV) *.egg-info
