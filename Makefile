# lcft: every install step lives here, so a fresh clone needs nothing but `make demo` / `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast bench bench-quick lint clean wheelhouse test-oldest-torch

setup: $(STAMP)

# torch is pinned and installed first: on this machine torch==2.13.0 is a local CPU wheel,
# while an unpinned torch would pull a multi-GB CUDA build.
# Every other package is pinned by constraints.txt (the versions the tests ran with).
$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,kernels]'
	touch $(STAMP)

demo: setup
	$(BIN)/lcft demo --out demo-out

# Tests run in one pytest-xdist worker per core (at most 4), each module whole in one worker (its fixtures built
# once): most tests run one thread or wait on processes they start (README, Development, has the time it takes).
# Modules are handed out in collection order, which puts the longest first (FIRST in tests/conftest.py): xdist's
# own order, most tests first, started the longest, one-test module last (the flag needs pytest-xdist 3.8).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))
PYTEST := TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

test: setup
	$(PYTEST)

test-fast: setup
	$(PYTEST) -m "not slow"

bench: setup
	$(BIN)/python benchmarks/run_all.py

bench-quick: setup
	$(BIN)/python benchmarks/run_all.py --quick

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache

# Wheels for an offline GPU node: every line of constraints.txt not marked "not carried", as manylinux x86-64
# builds for the node's Python (WHEEL_PYTHONS; pure-Python and abi3 wheels serve every version). Needs a package
# index here; copy the clone with wheelhouse/ to the node and run `make gpu-check` there (README, On a GPU node).
WHEEL_PYTHONS ?= 3.12
WHEEL_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
	manylinux_2_12_x86_64 manylinux2010_x86_64 manylinux1_x86_64
wheelhouse:
	rm -rf wheelhouse.tmp && mkdir wheelhouse.tmp
	grep -v 'not carried' constraints.txt > wheelhouse.tmp/requirements.txt
	for v in $(WHEEL_PYTHONS); do \
	  $(PY) -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version $$v \
	    $(addprefix --platform ,$(WHEEL_PLATFORMS)) -d wheelhouse.tmp -r wheelhouse.tmp/requirements.txt || exit 1; \
	done
	echo $(WHEEL_PYTHONS) > wheelhouse.tmp/pythons
	rm -rf wheelhouse && mv wheelhouse.tmp wheelhouse
	@echo "wheelhouse: $$(ls wheelhouse/*.whl | wc -l) wheels for Python $(WHEEL_PYTHONS), $$(du -sm wheelhouse | cut -f1) MiB"

# One NVIDIA GPU: .venv-gpu over PY's own CUDA torch (lcft and the rest from wheelhouse/ when it exists, else from
# the index), pytest -m gpu and the GPU benchmarks -> gpu-check-out/ (README, On a GPU node; docs/cuda.md). PY must
# be the python whose torch sees the GPU. GPU_CHECK_ARGS=--full runs the long sizes.
.PHONY: gpu-check
gpu-check:
	PY=$(PY) bash benchmarks/gpu_check.sh $(GPU_CHECK_ARGS)

# The oldest torch setup.cfg claims, in a second CPU venv (.venv-oldest): PyPI has no CPU build of it, so its Linux
# (CUDA) wheel (531 MB), installed without the pinned CUDA runtime it names, with the CUDA 13 libraries it loads at
# import (local wheels here; about 3 GB from PyPI elsewhere) and the triton it pins; the rest from constraints.txt,
# but numpy 2.3: triton 3.6's interpreter turns a scalar kernel argument (a 1-element 1-D array) into a Python int
# with int(array) (`tensor.__index__`, e.g. `range(n_slots)`), which numpy 2.4 refuses with a TypeError (the
# NumPy 1.25 deprecation expired); triton 3.9 squeezes the array first. CPU interpreter only.
OLDEST_TORCH := torch==2.11.0 triton==3.6.0
OLDEST_NUMPY := numpy==2.3.5
CUDA13_LIBS := nvidia-cublas==13.1.1.3 nvidia-cuda-cupti==13.0.85 nvidia-cuda-nvrtc==13.0.88 \
	nvidia-cudnn-cu13==9.24.0.43 nvidia-cufft==12.0.0.61 nvidia-cufile==1.15.1.6 nvidia-curand==10.4.0.35 \
	nvidia-cusolver==12.0.4.66 nvidia-cusparse==12.6.3.3 nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7 \
	nvidia-nvjitlink==13.4.92 nvidia-nvshmem-cu13==3.4.5 nvidia-nvtx==13.0.85 nvidia-cuda-runtime==13.5.37
OLDEST_TESTS ?= -m "not gpu" tests
test-oldest-torch:
	test -x .venv-oldest/bin/python || $(PY) -m venv .venv-oldest
	.venv-oldest/bin/pip install -q --no-deps $(OLDEST_TORCH) $(CUDA13_LIBS)
	grep -v -E '^(triton|setuptools|wheel)==' constraints.txt | sed 's/ *#.*//' | grep . \
	  | sed 's/^numpy==.*/$(OLDEST_NUMPY)/' > .venv-oldest/req.txt
	.venv-oldest/bin/pip install -q --no-deps -r .venv-oldest/req.txt
	.venv-oldest/bin/pip install -q --no-deps -e .
	TRITON_INTERPRET=1 .venv-oldest/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(OLDEST_TESTS)
