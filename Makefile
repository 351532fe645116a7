# Quick start: `make demo` runs the main job, `make test` runs the whole suite.
# Each works alone on a fresh machine: it creates .venv, installs the Debian
# packages laxflow needs (when root), installs laxflow with its native part,
# then runs.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
LAXFLOW := $(VENV)/bin/laxflow
# Debian packages: the shim's build needs <infiniband/verbs.h>; systemd-analyze checks deploy/*.service.
APT_PACKAGES := libibverbs-dev libibverbs1 libnuma1 iproute2 systemd
EXTRAS := test,torch

.PHONY: demo test test-sanitize install apt bench results clean vllm sglang nixl docs

demo: install
	$(LAXFLOW) sim serve --preset demo --plot out/demo.png
	@if [ "$$(id -u)" = 0 ]; then $(LAXFLOW) testbed run --name lxfdemo --requests 6 --modes off,on; \
	else echo "real-traffic part skipped: it needs root (network namespaces, qdiscs): sudo make demo"; fi

test: install vllm sglang nixl
	$(VENV)/bin/mkdocs build --strict -d $(CURDIR)/build/site
	$(PY) -m pytest -q tests

# The docs site (mkdocs-material) into build/site; --strict: a broken link or a missing page fails.
docs: install
	$(VENV)/bin/mkdocs build --strict -d $(CURDIR)/build/site

# The shim's multi-threaded scenarios under ThreadSanitizer and
# AddressSanitizer + UBSan alone (also part of `make test`).
test-sanitize: install
	$(PY) -m pytest -q tests/native/test_shim_sanitizers.py

install: apt $(VENV)/bin/python
	$(PIP) install -q --upgrade pip setuptools wheel cffi
	$(PIP) install -q --no-build-isolation -e '.[$(EXTRAS)]'
	$(MAKE) -s -C native/nccl_profiler OUT=$(CURDIR)/src/laxflow/_native

# vLLM for laxflow.integrations.vllm's tests, CPU only: the wheel with --no-deps (its
# resolved dependencies pull CUDA and a torchvision that breaks CPU torch), then only
# the light packages its imports need, within vLLM 0.32.0's own version ranges.
VLLM_VERSION := 0.32.0
VLLM_DEPS := numpy 'pydantic>=2.12.0' regex cbor2 psutil 'pyzmq>=25.0.0' 'transformers>=5.16.1,<5.20.0' \
  'aiohttp>=3.14.3' 'requests>=2.33.0' 'openai>=2.25.0' openai-harmony pybase64 cachetools msgspec \
  cloudpickle uvloop py-cpuinfo 'prometheus_client>=0.18.0' 'fastapi>=0.133.0,<0.137.0' partial-json-parser \
  'llguidance>=1.7.0,<1.8.0' einops blake3 'torch==2.13.0'

vllm: install $(VENV)/.vllm-$(VLLM_VERSION)

$(VENV)/.vllm-$(VLLM_VERSION):
	$(PIP) install -q --no-deps vllm==$(VLLM_VERSION)
	$(PIP) install -q $(VLLM_DEPS)
	$(PIP) install -q --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.11
	$(PY) -c "import importlib.metadata as m; assert m.version('vllm') == '$(VLLM_VERSION)'; assert m.version('torch').startswith('2.13.0')"
	touch $@

# SGLang for laxflow.integrations.sglang's tests, CPU only, in a folder of its own that only
# tests/integrations/sglang/conftest.py puts on sys.path: torchvision (a CUDA build, its ops
# unloadable beside CPU torch; vLLM imports it when present) and triton stay out of vLLM's way.
# The wheel with --no-deps, then only what its scheduler, schedule policy and Mooncake backend
# import, at SGLang 0.5.23's own pins where it has them. Cold: about 20 s from pip's cache.
SGLANG_VERSION := 0.5.23
SGLANG_SITE := $(VENV)/sglang-$(SGLANG_VERSION)
SGLANG_DEPS := orjson==3.13.0 setproctitle==1.3.8 xxhash==4.1.0 dill==0.4.1 loguru==0.7.3 gguf==0.19.0 \
  uvicorn==0.54.0 sentencepiece==0.2.1 compressed-tensors==0.18.0 triton==3.8.0 torchvision==0.28.0 \
  ipython==9.18.1 traitlets==5.16.1 jedi==0.20.1 parso==0.8.7 pexpect==4.9.0 ptyprocess==0.7.0 \
  prompt_toolkit==3.0.53 wcwidth==0.9.4 stack_data==0.6.3 asttokens==3.0.2 executing==2.3.0 \
  pure_eval==0.2.4 matplotlib_inline==0.2.2 ipython_pygments_lexers==1.1.1

sglang: install $(SGLANG_SITE)/.stamp

$(SGLANG_SITE)/.stamp:
	rm -rf $(SGLANG_SITE)
	$(PIP) install -q --no-deps --target $(SGLANG_SITE) sglang==$(SGLANG_VERSION) $(SGLANG_DEPS)
	touch $@

# NIXL for laxflow.adapters.nixl's tests: real transfers between two processes over UCX's
# TCP transport on lo, host memory, no GPU. The meta package with --no-deps (it requires both
# CUDA builds) and its CUDA 12 build, also --no-deps (its torch and numpy are laxflow's); with
# CPU torch the meta package loads whichever build is installed. About 70 MB from pip's cache.
NIXL_VERSION := 1.5.1

nixl: install $(VENV)/.nixl-$(NIXL_VERSION)

$(VENV)/.nixl-$(NIXL_VERSION):
	$(PIP) install -q --no-deps nixl==$(NIXL_VERSION) nixl-cu12==$(NIXL_VERSION)
	$(PY) -c "import importlib.metadata as m; assert m.version('nixl') == '$(NIXL_VERSION)'; from nixl._api import nixl_agent"
	touch $@

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

# Runs every bench/ script afresh (paper reproductions and component benchmarks; about an
# hour on a 2-core box), keeps each JSON under bench/results/ and writes docs/results/*.md and
# bench/README.md from them. ARGS passes options: ARGS='--only sim,policy', ARGS=--render-only.
results: install
	$(PY) bench/results.py $(ARGS)

bench: install
	$(PY) bench/network.py --json
	$(PY) bench/policy.py --json
	$(PY) bench/shim.py --json

clean:
	rm -rf build dist src/*.egg-info
