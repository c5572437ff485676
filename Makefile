# The README's commands: `make demo` and `make test`. Everything else is a step of those.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml scripts/build-control-plane.sh | sha1sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: setup control-plane test lint types contracts pytest crds crds-check demo bench clean sandbox-down vllm

setup: $(STAMP) control-plane

$(STAMP):
	@command -v $(PY) >/dev/null || { echo "need $(PY)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch only for checks on the HuggingFace side; ==2.13.0 takes the local CPU wheel.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[operator,workloads,dev]'
	rm -f $(VENV)/.installed-* && touch $@

control-plane:
	bash scripts/build-control-plane.sh

lint: $(STAMP)
	$(BIN)/ruff check operator workloads tests benchmarks
	$(BIN)/ruff format --check operator workloads tests benchmarks

types: $(STAMP)
	$(BIN)/mypy operator/tpuforge workloads/tpuforge_workloads

contracts: $(STAMP)
	$(BIN)/lint-imports

crds: $(STAMP)
	$(BIN)/tpuforge crds --out crds

pytest: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: setup lint types contracts pytest

demo: setup
	$(BIN)/tpuforge demo $(if $(PREEMPT),--preempt,)

sandbox-down:
	-$(BIN)/tpuforge sandbox down

bench: setup
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
