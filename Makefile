# Two entry points for a fresh machine; each sets up its own virtual environment.
#   make compare   optimize a built-in model (dcn_v2); compare with plain Inductor and PyTorch's Optimus
#   make test      run the test suite (long sweeps are marked slow: make test-all runs them)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q tests
	$(BIN)/python -m pytest -q bench/test_bench.py --benchmark-disable  # bench smoke: each model once, one family script

test-all: $(STAMP)
	$(BIN)/python -m pytest -q tests --runslow

compare: $(STAMP)
	$(BIN)/optimus-egg compare --model dcn_v2

.PHONY: setup test test-all compare
