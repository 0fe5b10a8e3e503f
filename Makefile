# gpuslice — the two set-up commands are `make run` and `make test`; both install what they need.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# pip itself is pinned like every other dependency: an upgrade changes nothing behind our back.
PIP_VERSION := 26.3

.PHONY: all run test test-python native native-test hack fuzz bench clean

all: $(STAMP) native

# The venv is (re)built whenever pyproject.toml, setup.py or a .proto changes (setup.py generates the gRPC
# modules of the kubelet APIs from the .proto files at install time).
PROTOS := $(shell find src -name '*.proto')
$(STAMP): pyproject.toml setup.py $(PROTOS)
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "gpuslice needs Python 3.11+, found " + sys.version' 
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet pip==$(PIP_VERSION)
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $@

# The enforcer: plain cc, no CUDA toolkit needed (prototypes live in native/include).
native:
	$(MAKE) -C native

native-test:
	$(MAKE) -C native test

# Test harnesses that are not shipped (the Kubernetes control plane built from Go modules).
hack:
	$(MAKE) -C hack

# lint-imports: the layer contracts in .importlinter (cli > kube | local | sim > host > placement | enforcer > spec).
test: $(STAMP) native native-test hack
	$(VENV)/bin/lint-imports .importlinter
	$(PY) -m pytest

# Bounded fuzzing of the enforcer's config parser.
fuzz:
	$(MAKE) -C native fuzz

bench: $(STAMP) native
	$(PY) bench/run_cpu_benchmarks.py

run: $(STAMP) native
	$(VENV)/bin/gpuslice demo

clean:
	$(MAKE) -C native clean
	rm -rf $(VENV) .pytest_cache .hypothesis
