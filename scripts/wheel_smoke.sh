#!/usr/bin/env bash
# CI (issue 52): build the wheel of this checkout in a clean environment and import it.
#
#   bash scripts/wheel_smoke.sh            # PYTHON=python3.11 by default
#
# 1. `pip wheel --no-deps` with build isolation (setuptools and wheel from the index, nothing of
#    the project's .venv), so the build needs only what pyproject.toml declares and a C++ compiler;
# 2. a fresh venv with the wheel and numpy < 2 only: no torch, no TensorFlow, no Horovod;
# 3. from a directory outside the checkout (so `import hvdcompress` is the installed copy): the
#    public API, a compressor from strings, and the compiled C++ kernel library of the wheel,
#    loaded and run on numpy arrays.
# Prints "wheel smoke test: OK ..." and exits 0, or says which step failed.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3.11}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/hvdc-wheel.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fail() { echo "wheel smoke test: FAILED at step '$1': $2" >&2; exit 1; }
start=$SECONDS

command -v "$PY" >/dev/null || fail "python" "$PY not found"
"$PY" -m venv "$TMP/venv" || fail "venv" "'$PY -m venv' failed"
VPY="$TMP/venv/bin/python"
"$VPY" -m pip install -q --upgrade pip || fail "pip" "could not upgrade pip in the fresh venv"

echo "[wheel] building the wheel (isolated build) from $ROOT"
# A copy of the tracked and untracked-but-not-ignored files: a wheel of what git would ship, not
# of a checkout's build/ folder or in-place _kernels*.so.
mkdir "$TMP/src"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$TMP/src" 2>/dev/null) \
  || cp -r "$ROOT/." "$TMP/src"
"$VPY" -m pip wheel -q --no-deps -w "$TMP/dist" "$TMP/src" > "$TMP/build.log" 2>&1 \
  || { tail -n 30 "$TMP/build.log" >&2; fail "build" "pip wheel failed (log above)"; }
WHEEL=$(ls "$TMP"/dist/hvdcompress-*.whl 2>/dev/null | head -n 1)
[ -n "$WHEEL" ] || fail "build" "no hvdcompress wheel in $TMP/dist"
grep -q "building the C++ kernels failed" "$TMP/build.log" && { cat "$TMP/build.log" >&2; fail "build" "the C++ kernels did not compile"; }
"$VPY" - "$WHEEL" <<'PY' || fail "wheel contents" "the wheel lacks the compiled kernels or its metadata"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
kernels = [n for n in names if "/_kernels" in n and n.endswith(".so")]
assert kernels, "no hvdcompress/**/_kernels*.so in the wheel"
assert any(n.endswith("/LICENSE") or "/licenses/LICENSE" in n for n in names), "no LICENSE in the wheel"
print(f"[wheel] {sys.argv[1].rsplit('/', 1)[-1]}: {len(names)} files, kernels {kernels}")
PY

echo "[wheel] installing it with numpy<2 into a fresh venv (no framework)"
"$VPY" -m pip install -q "$WHEEL" "numpy<2" || fail "install" "pip could not install the wheel"
"$VPY" -m pip check || fail "install" "pip check found broken requirements"

mkdir "$TMP/elsewhere"
cd "$TMP/elsewhere"
"$VPY" - "$ROOT" <<'PY' || fail "smoke test" "the installed package does not import or run (traceback above)"
import ctypes, glob, os, sys
import numpy as np

root = os.path.realpath(sys.argv[1])
import hvdcompress
from hvdcompress import TopK, from_params

package = os.path.dirname(os.path.realpath(hvdcompress.__file__))
assert not package.startswith(root + os.sep), f"imported the checkout ({package}), not the wheel"
for framework in ("torch", "tensorflow", "horovod"):
    assert framework not in sys.modules, f"import hvdcompress imported {framework}"
compressor = from_params({"compressor": "topk", "k": "0.01"})
assert isinstance(compressor.unwrap() if hasattr(compressor, "unwrap") else compressor, TopK), compressor

# The compiled kernel library, found in the installed package and loaded with ctypes: its C ABI
# lists the kernels it exports (capi.cpp's hvdc_kernels).
libraries = glob.glob(os.path.join(package, "**", "_kernels*.so"), recursive=True)
assert len(libraries) == 1, f"expected one _kernels*.so under {package}, found {libraries}"
lib = ctypes.CDLL(libraries[0])
lib.hvdc_kernels.restype = ctypes.c_void_p
count = ctypes.c_int64()
lib.hvdc_kernels.argtypes = [ctypes.POINTER(ctypes.c_int64)]
lib.hvdc_kernels(ctypes.byref(count))
assert count.value > 0, "the kernel library exports no kernels"

# ... and through the package's numpy binding (checked against the kernel table when loaded):
# a scatter-add of a sparse payload.
from hvdcompress.ops import native
out = native.sparse_sum(8, np.array([1, 6, 1], dtype=np.int64), np.array([1.5, -2.0, 0.25], dtype=np.float32))
expected = np.zeros(8, np.float32); expected[1], expected[6] = 1.75, -2.0
assert np.array_equal(out, expected), out
print(f"wheel smoke test: OK: hvdcompress {hvdcompress.__version__} from {package}, "
      f"{compressor!r}, C++ kernels {os.path.basename(libraries[0])} ({count.value} kernels) "
      f"loaded and run on numpy, no torch/tensorflow/horovod imported")
PY
echo "[wheel] done in $((SECONDS - start)) s"
