# Every target builds its own virtual environment from a bare Python on first use.
#   make test   — all tests (tiny random models + `slow` ones on the embedded SmolLM2)
#   make lint   — ruff + the import layers (lint-imports)
#   make demo   — the main job on the embedded default (label → fit → eval) on CPU
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# `pip install torch==2.13.0` resolves to a local CPU wheel on machines that ship one and to the
# regular PyPI (CUDA) build elsewhere. Override for other builds, e.g.
#   make TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" test
TORCH ?= torch==2.13.0

.PHONY: install test test-fast lint demo clean

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

clean:
	rm -rf $(VENV) *.egg-info
