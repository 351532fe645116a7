# Quick start: `make demo` runs the main job, `make test` runs the whole suite.
# Each works alone on a fresh machine: it creates .venv, installs the Debian
# packages laxflow needs (when root), installs laxflow with its native part,
# then runs.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
LAXFLOW := $(VENV)/bin/laxflow
# Debian packages: the shim's build needs <infiniband/verbs.h>.
APT_PACKAGES := libibverbs-dev libibverbs1 libnuma1 iproute2
EXTRAS := test,torch

.PHONY: demo test test-sanitize install apt bench clean

demo: install
	$(LAXFLOW) sim serve --preset demo --plot out/demo.png

test: install
	$(PY) -m pytest -q tests

# The shim's multi-threaded scenarios under ThreadSanitizer and
# AddressSanitizer + UBSan alone (also part of `make test`).
test-sanitize: install
	$(PY) -m pytest -q tests/native/test_shim_sanitizers.py

install: apt $(VENV)/bin/python
	$(PIP) install -q --upgrade pip setuptools wheel cffi
	$(PIP) install -q --no-build-isolation -e '.[$(EXTRAS)]'
	$(MAKE) -s -C native/nccl_profiler OUT=$(CURDIR)/src/laxflow/_native

$(VENV)/bin/python:
	python3 -m venv $(VENV)

apt:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  if ! dpkg -s $(APT_PACKAGES) >/dev/null 2>&1; then \
	    echo "installing Debian packages: $(APT_PACKAGES)"; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(APT_PACKAGES); \
	  fi; \
	else \
	  echo "not root: make sure these Debian packages are installed: $(APT_PACKAGES)"; \
	fi

bench: install
	$(PY) bench/network.py --json
	$(PY) bench/policy.py --json
	$(PY) bench/shim.py --json

clean:
	rm -rf build dist src/*.egg-info
