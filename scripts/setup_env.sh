#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install everything hvdcompress needs:
# torch, tensorflow-cpu, numpy<2, horovod 0.28.1 built from its sdist with PyTorch, TensorFlow and
# Gloo, and hvdcompress itself (editable). Idempotent: a step whose result is already there is skipped.
#
# Usage: scripts/setup_env.sh [VENV_DIR] [profile]
#   profile "main"   : torch 2.13.0 + tensorflow-cpu 2.15.1 (default)
#   profile "keras3" : tensorflow-cpu 2.18.1 (Keras 3), no torch
#
# The built Horovod wheel is cached outside the checkout, in $HVDC_WHEEL_CACHE
# (default ~/.cache/hvdcompress/wheels), in a folder keyed by the versions and build flags.
set -euo pipefail

VENV=${1:-.venv}
PROFILE=${2:-main}
PY=${PYTHON:-python3.11}
HOROVOD_VERSION=0.28.1
CACHE_ROOT=${HVDC_WHEEL_CACHE:-$HOME/.cache/hvdcompress/wheels}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

step() { echo "[setup] $*"; }
fail() { echo "[setup] FAILED at step '$1': $2" >&2; exit 1; }

case "$PROFILE" in
  main)   FRAMEWORK_PKGS=("torch==2.13.0" "tensorflow-cpu==2.15.1" "numpy<2"); WITH_TORCH=1 ;;
  keras3) FRAMEWORK_PKGS=("tensorflow-cpu==2.18.1" "numpy<2.1"); WITH_TORCH=0 ;;
  *) fail "arguments" "profile must be 'main' or 'keras3', got '$PROFILE'" ;;
esac

command -v "$PY" >/dev/null || fail "python" "$PY not found; Python 3.11 is required"
command -v g++ >/dev/null || fail "compiler" "g++ not found; install a C++ compiler (apt-get install g++)"
command -v cmake >/dev/null || NEED_CMAKE=1

if [ ! -x "$VENV/bin/python" ]; then
  step "creating virtual environment in $VENV"
  "$PY" -m venv "$VENV" || fail "venv" "'$PY -m venv $VENV' failed"
fi
VPY="$VENV/bin/python"
STAMP="$VENV/.hvdc-setup-$PROFILE"

have() { "$VPY" -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('$1') == '$2' else 1)" 2>/dev/null; }

step "installing frameworks: ${FRAMEWORK_PKGS[*]}"
if ! [ -f "$STAMP.frameworks" ]; then
  "$VPY" -m pip install -q --upgrade pip "setuptools<70" wheel || fail "pip bootstrap" "could not upgrade pip/setuptools/wheel"
  "$VPY" -m pip install -q "${FRAMEWORK_PKGS[@]}" "cmake<4" packaging || fail "frameworks" "pip could not install ${FRAMEWORK_PKGS[*]}"
  touch "$STAMP.frameworks"
fi
if [ "$WITH_TORCH" = 1 ] && ! have triton 3.9.0; then  # the gpu extra: CI tests the Triton kernels (interpreter)
  step "installing triton 3.9.0"
  "$VPY" -m pip install -q "triton==3.9.0" || fail "triton" "pip could not install triton==3.9.0"
fi

if ! have horovod "$HOROVOD_VERSION"; then
  TF_VER=$("$VPY" -c "import importlib.metadata as m; print(m.version('tensorflow-cpu'))")
  TORCH_VER=$("$VPY" -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null || echo none)
  KEY="horovod-$HOROVOD_VERSION-py311-torch$TORCH_VER-tf$TF_VER-gloo-nompi-nomxnet-cxx17"
  WHEEL_DIR="$CACHE_ROOT/$KEY"
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    step "building horovod $HOROVOD_VERSION from sdist (10-15 minutes on 2 cores); cache: $WHEEL_DIR"
    mkdir -p "$WHEEL_DIR"
    WRAP=$(mktemp -d)
    cat > "$WRAP/g++" <<'WRAPPER'
#!/usr/bin/env bash
# Horovod 0.28.1 compiles with -std=c++14; torch >= 2.1 headers need C++17.
args=()
for a in "$@"; do
  case "$a" in -std=c++11|-std=c++14) args+=("-std=c++17") ;; *) args+=("$a") ;; esac
done
exec /usr/bin/g++ "${args[@]}"
WRAPPER
    chmod +x "$WRAP/g++"
    export PATH="$VENV/bin:$PATH"
    CMAKE_POLICY_VERSION_MINIMUM=3.5 HOROVOD_WITH_PYTORCH=$WITH_TORCH HOROVOD_WITH_TENSORFLOW=1 \
    HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=gloo \
    MAKEFLAGS=-j2 CXX="$WRAP/g++" \
    env $( [ "$WITH_TORCH" = 1 ] || echo HOROVOD_WITHOUT_PYTORCH=1 ) \
      "$VPY" -m pip wheel --no-build-isolation --no-cache-dir --no-deps -w "$WHEEL_DIR.tmp" \
        "horovod==$HOROVOD_VERSION" > "$WHEEL_DIR.log" 2>&1 \
      || { tail -40 "$WHEEL_DIR.log" >&2; fail "horovod build" "pip wheel horovod==$HOROVOD_VERSION failed; full log: $WHEEL_DIR.log"; }
    mv "$WHEEL_DIR.tmp"/horovod-*.whl "$WHEEL_DIR"/ && rm -rf "$WHEEL_DIR.tmp" "$WRAP"
  else
    step "reusing cached horovod wheel from $WHEEL_DIR"
  fi
  "$VPY" -m pip install -q --no-deps "$WHEEL_DIR"/horovod-*.whl || fail "horovod install" "could not install the cached wheel"
  "$VPY" -m pip install -q cloudpickle psutil pyyaml || fail "horovod deps" "could not install horovod's runtime dependencies"
fi

stale=yes
if [ -f "$STAMP.project" ]; then  # reinstall (and rebuild the kernels) when their sources changed
  stale=$(find "$ROOT/setup.py" "$ROOT/pyproject.toml" "$ROOT/hvdcompress/ops" -newer "$STAMP.project" \
          \( -name '*.py' -o -name '*.toml' -o -name '*.cpp' -o -name '*.h' \) | head -1)
fi
if [ -n "$stale" ]; then
  step "installing hvdcompress (editable) and test/demo dependencies"
  "$VPY" -m pip install -q pytest tqdm scikit-learn matplotlib || fail "tools" "could not install pytest/tqdm/scikit-learn/matplotlib"
  "$VPY" -m pip install -q --no-build-isolation --no-deps -e "$ROOT" || fail "hvdcompress" "editable install failed"
  touch "$STAMP.project"
fi
if ! "$VPY" -c "import xdist" 2>/dev/null; then  # make test runs the suite on 2 workers, a file each
  step "installing pytest-xdist"
  "$VPY" -m pip install -q pytest-xdist || fail "pytest-xdist" "could not install pytest-xdist"
fi
step "environment ready: $VENV ($PROFILE)"
