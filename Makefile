# The README's commands. `make build` and `make test` each do all the set-up first.
VENV     ?= .venv
NF       := $(VENV)/bin/nodeforge
CONFIG   ?= configs/default.yaml
IMAGE    ?= images/gpu-node.yaml
export TESTCONTAINERS_RYUK_DISABLED := true

.PHONY: setup build test test-fast lint bench gpu-check clean

setup:
	@scripts/setup.sh

build: setup
	$(NF) build $(IMAGE) --config $(CONFIG)

test: setup
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

# the unit layer and the other tests that need no engine, no qemu, no network: well under a minute
# (the malformed-definition corpus is engine-free too, but marked slow: make test runs it)
test-fast:
	$(VENV)/bin/pytest -q -m "not engine and not slow" $(PYTEST_ARGS)

# shell scripts: the package's resources, scripts/, and every layer file that starts with a shell shebang
SHELL_SCRIPTS = builder/resources/*.sh scripts/*.sh \
	$$(find layers -path '*/files/*' -type f ! -name '*.j2' -exec awk 'FNR == 1 && /^\#!.*\/(ba|da)?sh( |$$)/ { print FILENAME }' {} +)

lint: setup
	$(VENV)/bin/ruff check builder tests benchmarks
	$(VENV)/bin/mypy
	shellcheck $(SHELL_SCRIPTS)

bench: setup
	$(VENV)/bin/python benchmarks/run.py

gpu-check: setup
	scripts/gpu-check.sh $(CUDA_VERSIONS)

clean:
	rm -rf build
