# lcft: every install step lives here, so a fresh clone needs nothing but `make demo` / `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast bench bench-quick lint clean

setup: $(STAMP)

# torch is pinned and installed first: on this machine torch==2.13.0 is a local CPU wheel,
# while an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,kernels]'
	touch $(STAMP)

demo: setup
	$(BIN)/lcft demo --out demo-out

test: setup
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q

test-fast: setup
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -m "not slow"

bench: setup
	$(BIN)/python benchmarks/run_all.py

bench-quick: setup
	$(BIN)/python benchmarks/run_all.py --quick

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache

# One NVIDIA GPU: CUDA torch + triton into .venv-gpu, pytest -m gpu, GPU benchmarks -> gpu-check-out/ (docs/cuda.md).
.PHONY: gpu-check
gpu-check:
	PY=$(PY) bash benchmarks/gpu_check.sh
