# codea1 — the README's two commands are `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.codea1-installed

.PHONY: setup run test test-slow test-gpu ui lint format lab-compare clean

## setup: create .venv (idempotent); CPU torch first where there is no CUDA, then the project with constraints
setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
	  echo "CUDA found: torch comes with the project install"; \
	else \
	  $(BIN)/python -m pip install -q torch==2.13.0; \
	fi
	@$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

## run: the main job — `dvc repro` of the default pipeline (prepare -> warmstart -> train -> evaluate -> register)
run: setup
	@test -d .dvc || $(BIN)/dvc init -q
	@PATH="$(abspath $(BIN)):$$PATH" $(BIN)/dvc repro
	@$(BIN)/python -m flows.summary

## test: the test suite without the opt-in gpu/slow markers
test: setup
	@$(BIN)/python -m pytest -m "not gpu and not slow"

test-slow: setup
	@$(BIN)/python -m pytest -m slow

test-gpu: setup
	@$(BIN)/python -m pytest -m gpu

## ui: Prefect UI (127.0.0.1:4200) and MLflow UI (127.0.0.1:5000)
ui: setup
	@$(BIN)/codea1 ui

lint: setup
	@$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: setup
	@$(BIN)/ruff check --fix . && $(BIN)/ruff format .

## lab-compare: golden / selfplay / codea1 / codea1 without the Mistake Book, 3 seeds each (DVC experiments)
lab-compare: setup
	@PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m flows.lab_compare

clean:
	rm -rf outputs data/prepared data/cache .pytest_cache
