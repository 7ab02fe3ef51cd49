"""The C++ kernels (kernels.h) on numpy arrays: the one CPU binding, for PyTorch and TensorFlow.

capi.cpp exports the kernels as a plain C ABI; setup.py compiles it with kernels_*.cpp into the
shared library ``hvdcompress/ops/_kernels*.so`` (no framework is needed to build or load it), and
this module calls it through ctypes (:mod:`~hvdcompress.ops.library`: loading, checking against
the table, calling; :mod:`~hvdcompress.ops.buffers`: the aligned numpy buffers). The functions here take and return C-contiguous numpy arrays; :class:`Bridge`
runs them on a framework's CPU tensors through zero-copy numpy views (``Tensor.numpy()`` for
torch, ``np.asarray`` and DLPack for TensorFlow). Semantics: kernels.h; why this design:
docs/kernels.md.

The functions are generated from the kernel table (:mod:`hvdcompress.ops.table`: each argument
checked by its role, outputs allocated, the C call) for every kernel declared with its C call;
the others are written by hand below. Their signatures are the table's, shared with the
plain-torch and Triton implementations: an ``out`` / ``*_out`` argument is an output buffer that
may be the input it replaces (in place, as torch does) or None (a new array, as TensorFlow
needs). The checks, the same as :class:`hvdcompress.ops.facade.Ops` makes on tensors, also keep a
wrong buffer from reaching C++ (dtype, contiguity, sizes, writable outputs).
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np

from . import roles, table
from .buffers import Array, empty, out_buffer, pointer, writable
from .library import call, library_path, load  # library_path: the backends log it (native.library_path)
from .table import implements


# ---- the kernels written by hand: what their declaration cannot say -------------------------------
# select_ge, dgc_select: outputs of a size known only after the call; sparse_sum: a C function per
# index dtype; fill_at: copies x into a separate out first; the low-rank products: 2-D shapes.
@implements
def select_ge(x: Array, threshold: float) -> Tuple[Array, Array]:
    """One compaction into a guessed capacity (n / 64), again with the exact count if it was short."""
    cap = min(x.size, max(1024, x.size // 64))
    while True:
        values, indices, total = empty(cap, np.float32), empty(cap, np.int64), ctypes.c_int64()
        call("select_ge", pointer(x, np.float32, "x"), x.size, threshold, cap, values.ctypes.data,
              indices.ctypes.data, ctypes.byref(total))
        if total.value <= cap:
            return values[:total.value], indices[:total.value]
        cap = total.value


@implements
def dgc_select(g: Array, u: Array, v: Array, mu: float, nesterov: bool, start: int, stride: int, top: int,
               cap: int, low: int, high: int, masking: bool, u_out: Optional[Array] = None,
               v_out: Optional[Array] = None) -> Tuple[Array, Array, Array, Array, int, float]:
    """One pass (kernels.h ``dgc_select``); values and indices in buffers of ``cap`` entries."""
    n = g.size
    args = [pointer(g, np.float32, "g"), pointer(u, np.float32, "u", n), pointer(v, np.float32, "v", n)]
    if not 0 <= cap <= n:
        raise ValueError(f"dgc_select: cap={cap} is out of range; allowed: 0..{n}")
    u_out, v_out = out_buffer(u_out, n, np.float32, "u_out"), out_buffer(v_out, n, np.float32, "v_out")
    values, indices = empty(cap, np.float32), empty(cap, np.int64)
    count, threshold = ctypes.c_int64(), ctypes.c_float()
    call("dgc_select", *args, n, float(mu), bool(nesterov), int(start), int(stride), int(top), int(cap),
          int(low), int(high), bool(masking), u_out.ctypes.data, v_out.ctypes.data, values.ctypes.data,
          indices.ctypes.data, ctypes.byref(threshold), ctypes.byref(count))
    kept = min(count.value, cap) if low <= count.value <= high else 0
    return u_out, v_out, values[:kept], indices[:kept], count.value, threshold.value


@implements
def sparse_sum(n: int, indices: Array, values: Array, out: Optional[Array] = None) -> Array:
    if indices.dtype not in (np.int32, np.int64):
        raise TypeError(f"indices must be int32 or int64, got {indices.dtype}")
    out = out_buffer(out, n, np.float32)
    call("scatter_add_i32" if indices.dtype == np.int32 else "scatter_add_i64",
          pointer(values, np.float32, "values"), pointer(indices, indices.dtype, "indices", values.size),
          values.size, n, out.ctypes.data)
    return out


@implements
def fill_at(x: Array, indices: Array, value: float, out: Optional[Array] = None,
            non_finite_only: bool = False) -> Array:
    """``x`` with ``x[indices] = value`` (only where ``x[indices]`` is not finite when
    ``non_finite_only``), in ``out`` (which may be ``x``; None: a copy of ``x``)."""
    pointer(x, np.float32, "x")
    if out is None:
        out = empty(x.size, np.float32)
        out[...] = x
    elif out is not x:
        pointer(writable(out, "out"), np.float32, "out", x.size)
        out[...] = x
    call("fill_at", writable(out, "x").ctypes.data, x.size, pointer(indices, np.int64, "indices"),
          indices.size, value, bool(non_finite_only))
    return out


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
    m = out_buffer(out, e.size, np.float32).reshape(rows, cols)
    call("lowrank_project", pointer(e, np.float32, "e"), None if g is None else pointer(g, np.float32, "g", e.size),
          pointer(q, np.float32, "q"), rows, cols, q.shape[1], m.ctypes.data, p.ctypes.data)
    return m, p


@implements
def lowrank_project_back(m: Array, p: Array) -> Array:
    q = empty(m.shape[1] * p.shape[1], np.float32).reshape(m.shape[1], p.shape[1])
    _lowrank_shapes(m, p, q, "lowrank_project_back")
    call("lowrank_project_back", pointer(m, np.float32, "m"), pointer(p, np.float32, "p"), m.shape[0],
          m.shape[1], p.shape[1], q.ctypes.data)
    return q


@implements
def lowrank_residual(m: Array, p: Array, q: Array, out: Optional[Array] = None) -> Array:
    """``m - p q^T`` flat, non-finite entries 0, into ``out`` (which may be ``m``)."""
    _lowrank_shapes(m, p, q, "lowrank_residual")
    out = out_buffer(None if out is None else out.reshape(-1), m.size, np.float32)
    call("lowrank_residual", pointer(m, np.float32, "m"), pointer(p, np.float32, "p"),
          pointer(q, np.float32, "q"), m.shape[0], m.shape[1], p.shape[1], out.ctypes.data)
    return out


# ---- the kernels generated from their declaration --------------------------------------------
_DTYPE_NAMES: Dict[np.dtype, str] = {}


class _Arrays:
    """The array queries of the table's roles (hvdcompress/ops/table.py), on numpy arrays."""

    @staticmethod
    def dtype(a: Any) -> str:
        if not isinstance(a, np.ndarray):
            raise TypeError(f"the C++ kernels take numpy arrays, got {type(a).__name__}")
        name = _DTYPE_NAMES.get(a.dtype)  # numpy's dtype.name takes microseconds
        return name if name is not None else _DTYPE_NAMES.setdefault(a.dtype, a.dtype.name)

    @staticmethod
    def ndim(a: Array) -> int:
        return a.ndim

    @staticmethod
    def numel(a: Array) -> int:
        return a.size

    @staticmethod
    def is_contiguous(a: Array) -> bool:
        return a.flags.c_contiguous

    @staticmethod
    def contiguous(a: Array) -> Array:
        return a  # a view must not be copied here: the roles then refuse it


def generate(kernel: table.Kernel) -> Callable:
    """The numpy function of ``kernel`` from its declaration: each argument checked by its role,
    output buffers given (checked writable) or allocated (64-byte aligned), new outputs
    allocated, then its C function called with the arguments of ``kernel.c``."""
    outputs = [p for p in kernel.params if isinstance(p.role, roles.Out)]
    new = [r for r in kernel.results if r.kind is not None]
    c_args = [a.lstrip("&") for a in kernel.c]

    def run(*args: Any, **kwargs: Any) -> Any:
        env = kernel.bind(args, kwargs)
        for p in kernel.order:
            value = env[p.name]
            if value is not None or p.default is not None:  # None: an optional argument left out
                env[p.name] = float(value) if isinstance(p.role, roles.Scalar) \
                    else p.role.check(_Arrays, kernel.name, p.name, value, env)
        for p in outputs:
            if env[p.name] is not None:
                writable(env[p.name], p.name)
            elif not isinstance(p.role, roles.Into) or env[p.role.target] is not None:
                env[p.name] = empty(env["n"], np.float32)
        for r in new:
            env[r.name] = empty(r.size(env), r.kind) if r.size else np.empty((), r.dtype)
        call(kernel.exports[0], *[_address(env[a]) for a in c_args])
        results = tuple(r.value(env[r.name]) for r in kernel.results)
        return results[0] if len(results) == 1 else results

    run.__name__ = run.__qualname__ = kernel.name
    run.__doc__ = kernel.doc or None
    run.__signature__ = kernel.signature()
    return implements(run)


def _address(value: Any) -> Any:
    return value.ctypes.data if isinstance(value, np.ndarray) else value


def _generated(written: Mapping[str, Any]) -> Dict[str, Callable]:
    """The generated function of every kernel declared with a C call; TypeError when one of them
    is also in ``written`` (this module's namespace)."""
    declared = {name: k for name, k in table.KERNELS.items() if k.c is not None}
    both = sorted(set(declared) & set(written))
    if both:
        raise TypeError(f"{__name__} writes {', '.join(both)} by hand, although the table declares "
                        "its C call")
    return {name: generate(k) for name, k in declared.items()}


globals().update(_generated(globals()))


#: The functions above by kernel name: every kernel of the table (checked at import: a kernel
#: both written by hand and declared with a C call is a TypeError).
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
