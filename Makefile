# The README's commands. `make build` and `make test` each do all the set-up first.
VENV     ?= .venv
NF       := $(VENV)/bin/nodeforge
CONFIG   ?= configs/default.yaml
IMAGE    ?= images/gpu-node.yaml
export TESTCONTAINERS_RYUK_DISABLED := true

.PHONY: setup build test lint bench gpu-check clean

setup:
	@scripts/setup.sh

build: setup
	$(NF) build $(IMAGE) --config $(CONFIG)

test: setup
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check builder tests benchmarks
	$(VENV)/bin/mypy

bench: setup
	$(VENV)/bin/python benchmarks/run.py

gpu-check: setup
	scripts/gpu-check.sh $(CUDA_VERSIONS)

clean:
	rm -rf build
