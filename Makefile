# The README's commands. `make build` and `make test` each do all the set-up first.
VENV     ?= .venv
NF       := $(VENV)/bin/nodeforge
CONFIG   ?= configs/default.yaml
IMAGE    ?= images/gpu-node.yaml
export TESTCONTAINERS_RYUK_DISABLED := true

.PHONY: setup build test test-fast test-offline lint bench gpu-check lock-report clean

setup:
	@scripts/setup.sh

# SET passes flags through, e.g. where NVIDIA's repository cannot be reached:
#   make build SET="--set nvidia-container-runtime.offline_source=file:/srv/nvidia-debs"
build: setup
	$(NF) build $(IMAGE) --config $(CONFIG) $(SET)

test: setup
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

# the unit layer: the pure logic, the architecture rule, step keys and the composer (under a minute)
FAST_TESTS = tests/unit tests/test_architecture.py tests/test_step_keys.py tests/test_compose.py tests/test_config_layers.py
test-fast:
	$(VENV)/bin/pytest -q -m "not engine and not slow" $(FAST_TESTS) $(PYTEST_ARGS)

# every test that needs no engine, no qemu, no network (the layers' programs on recorded output,
# hardening, fuzzing; a few minutes); the malformed-definition corpus is marked slow: make test runs it
test-offline:
	$(VENV)/bin/pytest -q -m "not engine and not slow" $(PYTEST_ARGS)

# shell scripts: the package's resources, scripts/, and every layer file that starts with a shell shebang
SHELL_SCRIPTS = builder/resources/*.sh scripts/*.sh \
	$$(find layers -path '*/files/*' -type f ! -name '*.j2' -exec awk 'FNR == 1 && /^\#!.*\/(ba|da)?sh( |$$)/ { print FILENAME }' {} +)

# the layers' Python programs (shipped without a .py suffix where they are commands)
LAYER_PYTHON = $$(find layers -path '*/files/*' -type f ! -name '*.j2' ! -name '*.py' -exec awk 'FNR == 1 && /^\#!.*python/ { print FILENAME }' {} +) $$(find layers -path '*/files/*.py' -type f)

# and every inline script of the layers (steps, command tests) rendered with the layers' defaults;
# an inline script over 10 lines of shell belongs in the layer's files/
lint: setup
	$(VENV)/bin/ruff check builder tests benchmarks tools $(LAYER_PYTHON)
	$(VENV)/bin/mypy
	shellcheck $(SHELL_SCRIPTS)
	$(VENV)/bin/python tools/lint_scripts.py --max-lines 10

bench: setup
	$(VENV)/bin/python benchmarks/run.py

# every lock against a fresh resolution, security updates marked [security]; a report (exit 0 on
# drift and when Debian's archive cannot be reached), for a scheduled job beside make test
lock-report: setup
	NF=$(NF) scripts/lock-report.sh

gpu-check: setup
	scripts/gpu-check.sh $(CUDA_VERSIONS)

clean:
	rm -rf build
