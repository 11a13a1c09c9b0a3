#!/usr/bin/env bash
# `make gpu-check`: on a machine with one NVIDIA GPU, make .venv-gpu over PY's own CUDA torch and triton, install
# lcft and the rest into it, then run benchmarks/gpu_check.py (pytest -m gpu, attention, 1b steps, the 1M plan).
# With wheelhouse/ (`make wheelhouse` where there is a package index) nothing is fetched: pip --no-index from it.
# Without it, packages come from the index, and so does TORCH_SPEC when PY has no torch.
# Results: gpu-check-out/gpu-check.json and gpu-check.md (--out DIR: in DIR, relative to the clone). Non-zero exit
# on a failed test, a benchmark's error or a numeric mismatch.
#   PY=/path/to/python-with-cuda-torch bash benchmarks/gpu_check.sh [--install-only] [--full] [gpu_check.py options]
# --install-only: the install step alone (nvidia-smi must still list a GPU; torch's CUDA is not asserted, nothing
# measured). Exit 2: no GPU listed, PY's torch older than setup.cfg's floor, PY without torch beside a wheelhouse,
# or PY with neither pip nor ensurepip.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
VENV=${VENV:-.venv-gpu}
WHEELHOUSE=${WHEELHOUSE:-wheelhouse}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}  # only when PY has no torch: PyPI's Linux (CUDA) wheel of the CPU pin
install_only=0
args=()
for a in "$@"; do
  if [ "$a" = --install-only ]; then install_only=1; else args+=("$a"); fi
done
say() { echo "gpu-check: $*" >&2; }
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  say "no NVIDIA GPU found (nvidia-smi); this check needs one."
  exit 2
fi
nvidia-smi -L
start=$(date +%s)
floor=$(sed -n 's/^ *torch>=\([0-9][0-9.]*\).*/\1/p' setup.cfg)
# PY's torch version (empty: none, or one that does not import), held to the floor by major.minor (a pre-release of
# a minor lcft is tested with passes); one import of torch, most of this python's time
torch_rc=0
base_torch=$("$PY" - "$floor" <<'EOF'
import sys
try:
    import torch
except Exception:  # one that does not import counts as none
    sys.exit(0)
have = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
need = tuple(int(x) for x in sys.argv[1].split(".")[:2])
if have < need:
    print(f"gpu-check: torch {torch.__version__} here is older than {sys.argv[1]}, the oldest lcft is tested with "
          "(setup.cfg); use a python with a newer torch (PY=...).", file=sys.stderr)
    sys.exit(3)
print(torch.__version__)
EOF
) || torch_rc=$?
[ "$torch_rc" = 3 ] && exit 2
[ "$torch_rc" = 0 ] || base_torch=""
pip_from=()
if [ -d "$WHEELHOUSE" ]; then
  pip_from=(--no-index --find-links "$WHEELHOUSE")
  if [ -z "$base_torch" ]; then
    say "$PY has no torch and $WHEELHOUSE/ carries none: set PY to the python whose CUDA torch sees the GPU."
    exit 2
  fi
  tag=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  grep -qw "$tag" "$WHEELHOUSE/pythons" 2>/dev/null ||
    say "note: $WHEELHOUSE/ holds compiled wheels for Python $(cat "$WHEELHOUSE/pythons" 2>/dev/null), this is $tag;" \
        "if pip misses one, rebuild it with: make wheelhouse WHEEL_PYTHONS=$tag"
fi
# .venv-gpu sees PY's packages: --system-site-packages, and, as a PY that is itself a venv (e.g. /opt/torch/.venv)
# hands on nothing that way (it means its base interpreter's), PY's own site folders through a .pth file. No pip of
# its own (--without-pip: a python without ensurepip, python3.X-venv absent, makes no venv otherwise): PY's pip,
# through those site folders, run as "$VENV/bin/python" -m pip so that it installs into .venv-gpu.
pip=("$VENV/bin/python" -m pip)
make_venv() {
  test -x "$VENV/bin/python" || "$PY" -m venv --without-pip --system-site-packages "$VENV" || return 1
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
  "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' > "$site/lcft-base-python.pth"
  "${pip[@]}" --version >/dev/null 2>&1 || "$VENV/bin/python" -m ensurepip -q >/dev/null 2>&1  # PY lacks pip
  "${pip[@]}" --version >/dev/null 2>&1
}
if ! make_venv; then  # a venv left half-made (an earlier run stopped in it): made again, once
  say "$VENV has no working python -m pip: making it again"
  rm -rf "$VENV"
  make_venv || { say "no pip for $VENV: $PY has none and no ensurepip; install pip for $PY."; exit 2; }
fi
# No bytecode compiled at install (pip compiles every file of transformers, torch's test tree ... : most of its
# time in a short slot); each process compiles what it imports, once, into the venv.
pip_opts=(-q --no-compile)
if [ ${#pip_from[@]} -eq 0 ]; then
  say "no $WHEELHOUSE/ here: packages come from the package index (make wheelhouse where there is one, for a node without)"
  index=${PIP_INDEX_URL:-https://pypi.org/simple/}
  if [ -z "${PIP_NO_INDEX:-}" ] && ! "$VENV/bin/python" benchmarks/gpu_check_deps.py reachable "$index"; then
    say "the package index ($index) does not answer in 5 s: pip tries once (--retries 0 --timeout 5)"
    # in the environment, not as flags: the pip that pip starts for an sdist's build dependencies (setuptools for
    # lcft's own -e install) reads it there and is given no flags of ours (it retried 5 times, 15 s each)
    export PIP_RETRIES=0 PIP_TIMEOUT=5 PIP_DEFAULT_TIMEOUT=5
  fi
fi
if [ -n "$base_torch" ]; then
  say "using $PY's torch $base_torch"
else
  "${pip[@]}" install "${pip_opts[@]}" "$TORCH_SPEC"  # pulls the matching triton and CUDA runtime wheels
fi
if [ ${#pip_from[@]} -eq 0 ]; then
  "${pip[@]}" install "${pip_opts[@]}" -e '.[kernels,test]' || exit 1
else
  # The wheelhouse holds the pinned closure of what lcft and its tests need beyond the node's torch: installed as
  # pinned, without resolving torch's own requirements (a node's torch may name CUDA wheels that its system
  # libraries stand in for), then pip check for what lcft's own packages still miss.
  req="$WHEELHOUSE/requirements.txt"
  [ -f "$req" ] || { say "$WHEELHOUSE/ has no requirements.txt: rebuild it with make wheelhouse."; exit 1; }
  if ! "${pip[@]}" install "${pip_opts[@]}" "${pip_from[@]}" --no-deps -r "$req" ||
     ! "${pip[@]}" install "${pip_opts[@]}" "${pip_from[@]}" --no-deps -e .; then
    say "pip found no wheel in $WHEELHOUSE/ for something $PY lacks: add its pin to constraints.txt, make wheelhouse."
    exit 1
  fi
  report=$("${pip[@]}" check 2>/dev/null || true)  # exit 1 whenever anything in reach misses something
  # What lcft's own packages miss (torch's floor is checked above; matplotlib: a note): gpu_check_deps.py
  missing=$(printf '%s\n' "$report" | "$VENV/bin/python" benchmarks/gpu_check_deps.py missing "$req")
  if [ -n "$missing" ]; then
    say "what lcft needs is not all here (the node's python must bring torch's needs and numpy;" \
        "anything else: add its pin to constraints.txt, make wheelhouse):"
    echo "$missing" >&2
    exit 1
  fi
fi
say "installed in $(( $(date +%s) - start )) s"
[ "$install_only" = 1 ] && exit 0
# fp32 matmuls as torch asks for them: some CUDA images turn TF32 on for every fp32 cuBLAS call, and the GPU tests
# hold fp32 results to fp32 tolerances (the benchmarks run in bf16, which this leaves alone)
unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE
export NVIDIA_TF32_OVERRIDE=0
"$VENV/bin/python" -c "import torch, triton; assert torch.cuda.is_available(), 'torch has no CUDA'; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
"$VENV/bin/python" benchmarks/gpu_check.py --out gpu-check-out ${args[@]+"${args[@]}"}  # before bash 4.4 an empty array is unbound under set -u
say "done in $(( $(date +%s) - start )) s"
