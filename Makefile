# Two commands do all set-up: `make demo` and `make test`. Both create .venv (Python 3.11) when missing.
PYTHON ?= python3.11
VENV ?= .venv
# A CPU build by default; on a GPU machine e.g. `make test TORCH="torch==2.13.0 --index-url ..."`.
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench venv clean-demo

venv: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall when the dependencies change. torch goes first so pip never pulls a multi-GB CUDA build.
$(STAMP): setup.py Makefile | $(PY)
	$(PY) -m pip install --upgrade pip setuptools wheel
	$(PY) -m pip install $(TORCH)
	$(PY) -m pip install -e '.[test]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

# Optimizer-step benchmark: docs/benchmark.md (+ .json); uses the GPU when there is one.
bench: $(STAMP)
	$(PY) scripts/benchmark.py --sizes tiny base --e2e 200 --readme README.md --out-md docs/benchmark.md --out-json docs/benchmark.json

demo: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

clean-demo:
	rm -rf demo-out
