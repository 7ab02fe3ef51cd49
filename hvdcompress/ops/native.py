"""The C++ kernels (kernels.h) on numpy arrays: the one CPU binding, for PyTorch and TensorFlow.

capi.cpp exports the kernels as a plain C ABI; setup.py compiles it with kernels.cpp into the
shared library ``hvdcompress/ops/_kernels*.so`` (no framework is needed to build or load it), and
this module calls it through ctypes, which releases the GIL for the duration of each call. The
library lists its C functions with their argument types, from which :func:`load` builds the
ctypes signatures. The functions here take and return C-contiguous numpy arrays; :class:`Bridge`
runs them on a framework's CPU tensors through zero-copy numpy views (``Tensor.numpy()`` for
torch, ``np.asarray`` and DLPack for TensorFlow). Semantics: kernels.h; why this design:
docs/kernels.md.

The function signatures are the kernel table's (:mod:`hvdcompress.ops.table`), shared with the
plain-torch and Triton implementations: an ``out`` / ``*_out`` argument is an output buffer that
may be the input it replaces (in place, as torch does) or None (a new array, as TensorFlow
needs). The argument checks here are the raw-memory boundary's (dtype, contiguity, sizes): they
keep a wrong buffer from reaching C++. The user-facing checks are
:class:`hvdcompress.backend.Ops`'.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import os
import sys
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import numpy as np

from . import table
from .layout import packed_bytes
from .table import implements

Array = np.ndarray
_ALIGN = 64  # TensorFlow wraps a buffer without copying only when it is this aligned
_LIB: dict = {}
_POOL: dict = {}  # byte size -> raw buffers handed out before (see empty)
_POOL_MIN = 1 << 20  # bytes: smaller buffers come from malloc's free lists anyway
_POOL_PER_SIZE = 4
_POOL_MAX_BYTES = 1 << 30
_POOL_BYTES = [0]

#: ctypes types of the argument codes in the library's kernel list (Python struct letters).
_CTYPES = {"P": ctypes.c_void_p, "?": ctypes.c_bool, "i": ctypes.c_int, "I": ctypes.c_uint32,
           "q": ctypes.c_int64, "f": ctypes.c_float, "d": ctypes.c_double}
_ERRORS = {1: ValueError, 2: IndexError}


def library_path() -> str:
    """The path of the compiled kernel library (``_kernels`` + the extension-module suffix)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(here, "_kernels" + suffix)
        if os.path.exists(path):
            return path
    raise ImportError(f"the C++ kernel library hvdcompress/ops/_kernels*.so is not built (looked in "
                      f"{here}); build it with `pip install --no-build-isolation -e .`")


class _Entry(ctypes.Structure):
    """capi.cpp's ``hvdc_kernel``: a C function of the library with its argument codes."""
    _fields_ = [("name", ctypes.c_char_p), ("signature", ctypes.c_char_p), ("function", ctypes.c_void_p)]


def load() -> Dict[str, Callable[..., int]]:
    """The kernel library's C functions by name, with their ctypes signatures (loaded once);
    ImportError when it is not built or does not export exactly the C functions of
    :data:`hvdcompress.ops.table.C_FUNCTIONS` (a library built from other sources)."""
    if "functions" not in _LIB:
        path = library_path()
        try:
            lib = ctypes.CDLL(path)
            listing = lib.hvdc_kernels
        except (OSError, AttributeError) as exc:
            raise ImportError(f"could not load the C++ kernel library {path}: {exc}") from exc
        listing.argtypes, listing.restype = [ctypes.POINTER(ctypes.c_int64)], ctypes.POINTER(_Entry)
        lib.hvdc_error.restype = ctypes.c_char_p
        count = ctypes.c_int64()
        exported = {e.name.decode(): e for e in listing(ctypes.byref(count))[:count.value]}
        _check_exports(exported, path)
        _LIB["lib"] = lib
        _LIB["functions"] = {
            name: ctypes.CFUNCTYPE(ctypes.c_int, *(_CTYPES[c] for c in e.signature.decode()))(e.function)
            for name, e in exported.items()}
    return _LIB["functions"]


def _check_exports(exported: Iterable[str], path: str) -> None:
    """ImportError unless the library at ``path`` exports exactly the table's C functions."""
    missing, extra = set(table.C_FUNCTIONS) - set(exported), set(exported) - set(table.C_FUNCTIONS)
    if missing or extra:
        raise ImportError(f"the C++ kernel library {path} does not match hvdcompress/ops/table.py "
                          f"(missing: {sorted(missing)}, not declared: {sorted(extra)}); rebuild "
                          "it with `pip install --no-build-isolation -e .`")


def _call(name: str, *args: Any) -> None:
    status = load()[name](*args)
    if status:
        raise _ERRORS.get(status, RuntimeError)(_LIB["lib"].hvdc_error().decode())


def empty(n: int, dtype: Any) -> Array:
    """An uninitialised 1-D array of ``n`` elements whose buffer is 64-byte aligned.

    Buffers of 1 MiB or more are recycled: a fresh one would come from mmap, and its first
    writes page-fault (here a fresh 100 MB output costs several times its memcpy). Each raw
    buffer handed out is kept, up to 4 per size and 1 GiB in all, and handed out again once
    nothing else references it: no array viewing it, hence no torch or TensorFlow tensor
    wrapping it (both hold a reference to the array they wrap)."""
    dtype = np.dtype(dtype)
    nbytes = n * dtype.itemsize + _ALIGN
    raw = _recycled(nbytes) if nbytes >= _POOL_MIN else None
    if raw is None:
        raw = np.empty(nbytes, np.uint8)
        kept = _POOL.setdefault(nbytes, []) if nbytes >= _POOL_MIN else None
        if kept is not None and len(kept) < _POOL_PER_SIZE and _POOL_BYTES[0] + nbytes <= _POOL_MAX_BYTES:
            kept.append(raw)
            _POOL_BYTES[0] += nbytes
    start = (-raw.ctypes.data) % _ALIGN
    return raw[start:start + n * dtype.itemsize].view(dtype)


def _recycled(nbytes: int) -> Optional[Array]:
    """A kept raw buffer of ``nbytes`` that nothing outside the pool references, or None."""
    for raw in _POOL.get(nbytes, ()):
        if sys.getrefcount(raw) == 3:  # the pool's list, ``raw`` here and getrefcount's argument
            return raw
    return None


def _buf(a: Array, dtype: Any, what: str, n: Optional[int] = None) -> int:
    """The address of ``a``'s buffer after checking that ``a`` is a C-contiguous numpy array of
    ``dtype`` (and ``n`` elements)."""
    if not isinstance(a, np.ndarray) or a.dtype != np.dtype(dtype) or not a.flags.c_contiguous:
        raise TypeError(f"{what} must be a C-contiguous {np.dtype(dtype).name} array, got "
                        f"{getattr(a, 'dtype', type(a).__name__)}")
    if n is not None and a.size != n:
        raise ValueError(f"{what} has {a.size} elements; {n} are needed")
    return a.ctypes.data


def _writable(a: Array, what: str) -> Array:
    if not a.flags.writeable:
        raise ValueError(f"{what} is read-only")
    return a


def _out(out: Optional[Array], n: int, dtype: Any, what: str = "out") -> Array:
    """The caller's output buffer (checked) or a new aligned one."""
    if out is None:
        return empty(n, dtype)
    _buf(_writable(out, what), dtype, what, n)
    return out


def _ranks(a: Array, each: int, what: str) -> int:
    if each <= 0 or a.size == 0 or a.size % each:
        raise ValueError(f"{what} has {a.size} elements, not a positive multiple of {each}")
    return a.size // each


# ---- encoders -------------------------------------------------------------------------------
@implements
def sign_pack(x: Array) -> Tuple[Array, Array]:
    total = ctypes.c_double()
    out = empty(packed_bytes(x.size, 1), np.uint8)
    _call("sign_pack", _buf(x, np.float32, "x"), x.size, out.ctypes.data, ctypes.byref(total))
    return out, np.array([total.value / max(1, x.size)], np.float32)


@implements
def ef_sign_pack(x: Array, residual: Array, out: Optional[Array] = None) -> Tuple[Array, Array, Array]:
    res_out = _out(out, x.size, np.float32, "residual out")
    packed, scale = empty(packed_bytes(x.size, 1), np.uint8), ctypes.c_float()
    _call("ef_sign_pack", _buf(x, np.float32, "x"), _buf(residual, np.float32, "residual", x.size),
          x.size, packed.ctypes.data, res_out.ctypes.data, ctypes.byref(scale))
    return packed, np.array([scale.value], np.float32), res_out


@implements
def twobit_pack(x: Array, threshold: float, residual: Optional[Array] = None,
                out: Optional[Array] = None) -> Tuple[Array, Optional[Array]]:
    packed = empty(packed_bytes(x.size, 2), np.uint8)
    res_out = None if residual is None else _out(out, x.size, np.float32, "residual out")
    _call("twobit_pack", _buf(x, np.float32, "x"),
          None if residual is None else _buf(residual, np.float32, "residual", x.size), x.size,
          threshold, packed.ctypes.data, None if res_out is None else res_out.ctypes.data)
    return packed, res_out


@implements
def levels_pack(x: Array, inv: float, levels: int, natural: bool, key: int) -> Array:
    out = empty(x.size, np.uint8)
    _call("levels_pack", _buf(x, np.float32, "x"), x.size, inv, levels, bool(natural), key,
          out.ctypes.data)
    return out


@implements
def ternary_pack(x: Array, inv: float, key: int) -> Array:
    out = empty(packed_bytes(x.size, 2), np.uint8)
    _call("ternary_pack", _buf(x, np.float32, "x"), x.size, inv, key, out.ctypes.data)
    return out


@implements
def natural_pack(x: Array, key: int) -> Array:
    out = empty(x.size, np.uint8)
    _call("natural_pack", _buf(x, np.float32, "x"), x.size, key, out.ctypes.data)
    return out


@implements
def half_cast(x: Array, bf16: bool) -> Array:
    """The bit patterns of ``x`` rounded to binary16 (bfloat16 when ``bf16``), as int16."""
    out = empty(x.size, np.int16)
    _call("half_cast", _buf(x, np.float32, "x"), x.size, bool(bf16), out.ctypes.data)
    return out


@implements
def minmax_pack(x: Array, chunk: int) -> Tuple[Array, Array]:
    codes, bounds = empty(x.size, np.uint8), empty(2 * -(-x.size // chunk), np.float32)
    _call("minmax_pack", _buf(x, np.float32, "x"), x.size, chunk, codes.ctypes.data,
          bounds.ctypes.data)
    return codes, bounds


# ---- decoders -------------------------------------------------------------------------------
@implements
def unpack_sum(packed: Array, n: int, bits: int, tables: Array, out: Optional[Array] = None) -> Array:
    ranks = _ranks(packed, packed_bytes(n, bits), "packed")
    if tables.size != ranks << bits:
        raise ValueError(f"tables has {tables.size} entries; {ranks} payloads of {bits}-bit codes "
                         f"need {ranks << bits}")
    out = _out(out, n, np.float32)
    _call("unpack_sum", _buf(packed, np.uint8, "packed"), n, bits, _buf(tables, np.float32, "tables"),
          ranks, out.ctypes.data)
    return out


@implements
def bf16_sum(bits: Array, n: int, out: Optional[Array] = None) -> Array:
    ranks = _ranks(bits, n, "bits")
    out = _out(out, n, np.float32)
    _call("bf16_sum", _buf(bits.view(np.uint16), np.uint16, "bits"), n, ranks, out.ctypes.data)
    return out


@implements
def sign_vote(packed: Array, n: int, scale: float, out: Optional[Array] = None) -> Array:
    ranks = _ranks(packed, packed_bytes(n, 1), "packed")
    out = _out(out, n, np.float32)
    _call("sign_vote", _buf(packed, np.uint8, "packed"), n, ranks, scale, out.ctypes.data)
    return out


@implements
def minmax_unpack_sum(codes: Array, bounds: Array, n: int, chunk: int,
                      out: Optional[Array] = None) -> Array:
    ranks = _ranks(codes, n, "codes")
    chunks = -(-n // chunk)
    if bounds.size != 2 * chunks * ranks:
        raise ValueError(f"bounds has {bounds.size} entries; {ranks} payloads of {chunks} chunks "
                         f"need {2 * chunks * ranks}")
    out = _out(out, n, np.float32)
    _call("minmax_unpack_sum", _buf(codes, np.uint8, "codes"), _buf(bounds, np.float32, "bounds"),
          n, chunk, ranks, out.ctypes.data)
    return out


@implements
def sparse_sum(n: int, indices: Array, values: Array, out: Optional[Array] = None) -> Array:
    if indices.dtype not in (np.int32, np.int64):
        raise TypeError(f"indices must be int32 or int64, got {indices.dtype}")
    out = _out(out, n, np.float32)
    _call("scatter_add_i32" if indices.dtype == np.int32 else "scatter_add_i64",
          _buf(values, np.float32, "values"), _buf(indices, indices.dtype, "indices", values.size),
          values.size, n, out.ctypes.data)
    return out


# ---- reductions and selection -----------------------------------------------------------------
@implements
def max_abs(x: Array) -> Array:
    result = ctypes.c_float()
    _call("max_abs", _buf(x, np.float32, "x"), x.size, ctypes.byref(result))
    return np.array(result.value, np.float32)


@implements
def l2_norm(x: Array) -> Array:
    result = ctypes.c_float()
    _call("l2_norm", _buf(x, np.float32, "x"), x.size, ctypes.byref(result))
    return np.array(result.value, np.float32)


@implements
def count_ge(x: Array, threshold: float) -> int:
    result = ctypes.c_int64()
    _call("count_ge", _buf(x, np.float32, "x"), x.size, threshold, ctypes.byref(result))
    return result.value


@implements
def select_ge(x: Array, threshold: float) -> Tuple[Array, Array]:
    """One compaction into a guessed capacity (n / 64), again with the exact count if it was short."""
    cap = min(x.size, max(1024, x.size // 64))
    while True:
        values, indices, total = empty(cap, np.float32), empty(cap, np.int64), ctypes.c_int64()
        _call("select_ge", _buf(x, np.float32, "x"), x.size, threshold, cap, values.ctypes.data,
              indices.ctypes.data, ctypes.byref(total))
        if total.value <= cap:
            return values[:total.value], indices[:total.value]
        cap = total.value


@implements
def sampled_threshold(x: Array, start: int, stride: int, top: int) -> float:
    result = ctypes.c_float()
    _call("sampled_threshold", _buf(x, np.float32, "x"), x.size, start, stride, top,
          ctypes.byref(result))
    return result.value


@implements
def topk_abs(x: Array, k: int) -> Tuple[Array, Array]:
    values, indices = empty(k, np.float32), empty(k, np.int64)
    _call("topk_abs", _buf(x, np.float32, "x"), x.size, k, values.ctypes.data, indices.ctypes.data)
    return values, indices


# ---- state updates --------------------------------------------------------------------------
@implements
def fill_at(x: Array, indices: Array, value: float, out: Optional[Array] = None,
            non_finite_only: bool = False) -> Array:
    """``x`` with ``x[indices] = value`` (only where ``x[indices]`` is not finite when
    ``non_finite_only``), in ``out`` (which may be ``x``; None: a copy of ``x``)."""
    _buf(x, np.float32, "x")
    if out is None:
        out = empty(x.size, np.float32)
        out[...] = x
    elif out is not x:
        _buf(_writable(out, "out"), np.float32, "out", x.size)
        out[...] = x
    _call("fill_at", _writable(out, "x").ctypes.data, x.size, _buf(indices, np.int64, "indices"),
          indices.size, value, bool(non_finite_only))
    return out


@implements
def sub_finite(a: Array, b: Array, out: Optional[Array] = None) -> Array:
    out = _out(out, a.size, np.float32)
    _call("sub_finite", _buf(a, np.float32, "a"), _buf(b, np.float32, "b", a.size), a.size,
          out.ctypes.data)
    return out


@implements
def momentum_correction(g: Array, u: Array, v: Array, mu: float, nesterov: bool,
                        u_out: Optional[Array] = None, v_out: Optional[Array] = None) -> Tuple[Array, Array]:
    u_out, v_out = _out(u_out, g.size, np.float32, "u_out"), _out(v_out, g.size, np.float32, "v_out")
    _call("momentum_correction", _buf(g, np.float32, "g"), _buf(u, np.float32, "u", g.size),
          _buf(v, np.float32, "v", g.size), g.size, mu, bool(nesterov), u_out.ctypes.data,
          v_out.ctypes.data)
    return u_out, v_out


def _lowrank_shapes(m: Array, p: Array, q: Array, what: str) -> None:
    if not (m.ndim == p.ndim == q.ndim == 2 and p.shape[0] == m.shape[0] and q.shape[0] == m.shape[1]
            and p.shape[1] == q.shape[1] >= 1):
        raise ValueError(f"{what}: shapes {m.shape}, {p.shape}, {q.shape} do not fit m (rows, cols), "
                         "p (rows, r), q (cols, r)")


@implements
def lowrank_project(e: Array, g: Optional[Array], q: Array,
                    out: Optional[Array] = None) -> Tuple[Array, Array]:
    """``(m, m q)`` with ``m = e + g`` written into ``out`` (which may be ``e``)."""
    rows, cols = e.shape
    p = empty(rows * q.shape[1], np.float32).reshape(rows, q.shape[1])
    _lowrank_shapes(e, p, q, "lowrank_project")
    m = _out(out, e.size, np.float32).reshape(rows, cols)
    _call("lowrank_project", _buf(e, np.float32, "e"), None if g is None else _buf(g, np.float32, "g", e.size),
          _buf(q, np.float32, "q"), rows, cols, q.shape[1], m.ctypes.data, p.ctypes.data)
    return m, p


@implements
def lowrank_project_back(m: Array, p: Array) -> Array:
    q = empty(m.shape[1] * p.shape[1], np.float32).reshape(m.shape[1], p.shape[1])
    _lowrank_shapes(m, p, q, "lowrank_project_back")
    _call("lowrank_project_back", _buf(m, np.float32, "m"), _buf(p, np.float32, "p"), m.shape[0],
          m.shape[1], p.shape[1], q.ctypes.data)
    return q


@implements
def lowrank_residual(m: Array, p: Array, q: Array, out: Optional[Array] = None) -> Array:
    """``m - p q^T`` flat, non-finite entries 0, into ``out`` (which may be ``m``)."""
    _lowrank_shapes(m, p, q, "lowrank_residual")
    out = _out(None if out is None else out.reshape(-1), m.size, np.float32)
    _call("lowrank_residual", _buf(m, np.float32, "m"), _buf(p, np.float32, "p"),
          _buf(q, np.float32, "q"), m.shape[0], m.shape[1], p.shape[1], out.ctypes.data)
    return out


#: The functions above by kernel name: every kernel of the table (checked at import).
IMPLEMENTATION = table.implementation(globals())


class Bridge:
    """The kernels above on a framework's CPU tensors, without copies: every tensor argument is
    viewed as a numpy array with ``to_numpy`` and every array result wrapped with ``wrap``; a
    result that is an argument's view (an in-place ``out``) comes back as that argument itself.
    Python numbers pass through both ways."""

    def __init__(self, is_tensor: Callable[[Any], bool], to_numpy: Callable[[Any], Array],
                 wrap: Callable[[Array], Any]):
        load()  # ImportError now, not at the first call, when the library is not built
        self._is_tensor, self._to_numpy, self._wrap = is_tensor, to_numpy, wrap
        for name, fn in IMPLEMENTATION.items():
            setattr(self, name, self._bind(fn))

    def _bind(self, fn: Callable) -> Callable:
        @functools.wraps(fn)  # the kernel's name, docstring and (inspect.signature) parameters
        def call(*args: Any, **kwargs: Any) -> Any:
            views: dict = {}

            def view(a: Any) -> Any:
                if not self._is_tensor(a):
                    return a
                arr = self._to_numpy(a)
                views[id(arr)] = (arr, a)
                return arr

            result = fn(*map(view, args), **{k: view(v) for k, v in kwargs.items()})
            return tuple(map(self._back(views), result)) if isinstance(result, tuple) \
                else self._back(views)(result)
        return call

    def _back(self, views: dict) -> Callable[[Any], Any]:
        def back(r: Any) -> Any:
            if not isinstance(r, np.ndarray):
                return r
            arg = views.get(id(r))
            return arg[1] if arg is not None and arg[0] is r else self._wrap(r)
        return back
