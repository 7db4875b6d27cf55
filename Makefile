# The README's commands. Every target that needs Python makes .venv first, so a fresh
# machine needs nothing but python3 (>= 3.11) and make.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SOURCES := cluster server webhook extender certs loadtest console tests tools
# The webhook's review path compiled with mypyc (tools/compile.py says which modules and
# why); rebuilt when any source it could depend on changes.
COMPILED := build/compiled.stamp
COMPILED_DEPS := tools/compile.py $(shell find cluster webhook -name '*.py' 2>/dev/null)

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,loadtest]'
	touch $@

venv: $(STAMP) ## create .venv and install the project with its test extras

$(COMPILED): $(STAMP) $(COMPILED_DEPS)
	$(BIN)/python tools/compile.py
	mkdir -p $(dir $@) && touch $@

compiled: $(COMPILED) ## compile the webhook's review path with mypyc (test, demo and e2e do it first)

clean-compiled: ## remove the compiled modules: the sources run as they are
	test ! -x $(BIN)/python || $(BIN)/python tools/compile.py --clean
	rm -f $(COMPILED)

check: $(STAMP) ## ruff, ruff format, mypy --strict, import-linter
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	$(BIN)/mypy $(SOURCES)
	$(BIN)/lint-imports

test: check $(COMPILED) ## the full suite: checks, then every test layer (on the compiled modules)
	$(BIN)/python -m pytest

certs: $(STAMP) ## make the CA and certificates in certs-out/, caBundle into manifests/
	$(BIN)/python -m certs --out certs-out --dns localhost --ip 127.0.0.1 --patch-manifests

demo: $(STAMP) $(COMPILED) ## both servers + simulated Kueue and kube-scheduler on a sample cluster; reports in reports/
	$(BIN)/python -m loadtest demo

loadtest: $(STAMP) ## the load-test tool's modes and examples (see README, "Load testing")
	$(BIN)/python -m loadtest --help

e2e-assets: ## build or fetch the e2e control plane (Kubernetes v1.36.3, etcd, Kueue and JobSet) and promtool into ~/.cache/tessera
	tests/e2e/build_binaries.sh >/dev/null
	tests/e2e/build_binaries.sh crds >/dev/null
	tests/e2e/build_binaries.sh kueue >/dev/null
	tests/e2e/build_binaries.sh jobset >/dev/null
	tests/e2e/build_binaries.sh promtool >/dev/null

e2e: $(STAMP) $(COMPILED) e2e-assets ## the end-to-end suite against a real control plane
	$(BIN)/python -m pytest tests/e2e -m e2e

fmt: $(STAMP) ## format and autofix
	$(BIN)/ruff format $(SOURCES)
	$(BIN)/ruff check --fix $(SOURCES)

.PHONY: help venv compiled clean-compiled check test certs demo loadtest e2e e2e-assets fmt
