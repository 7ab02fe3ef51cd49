"""The array operations a framework provides to the core.

Every algorithm in :mod:`hvdcompress.compressors` is written once, against this small
interface, and runs unchanged on PyTorch tensors (:mod:`hvdcompress.ops.torch_ops`) and TensorFlow
tensors (:mod:`hvdcompress.ops.tf_ops`). Tensors are opaque to the core: it only passes them
to these methods and combines them with ``+``, ``-``, ``*`` and ``/``.

State (residuals, momenta) lives in a plain ``dict`` per tensor; a backend decides how a value is
stored (:meth:`Ops.write`): in place for torch, ``tf.Variable.assign`` for TensorFlow, so the
same algorithm code is checkpointable in both.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import numpy as np

from . import counter_hash, roles
from .methods import add_kernel_methods

Tensor = Any
#: A scalar: a Python number, or a 0-d / 1-element tensor on the data's device.
Scalar = Any

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


class Ops(ABC):
    """Framework array operations on flat (1-D) tensors. Indices are int64 unless stated."""

    name: str = "abstract"

    # --- introspection -------------------------------------------------------------------
    @abstractmethod
    def numel(self, x: Tensor) -> int: ...

    @abstractmethod
    def dtype(self, x: Tensor) -> str:
        """The dtype as a numpy-style name: 'float32', 'float16', 'int64', ..."""

    @abstractmethod
    def element_size(self, x: Tensor) -> int: ...

    # --- creation and conversion ---------------------------------------------------------
    @abstractmethod
    def zeros(self, n: int, like: Tensor, dtype: str | None = None) -> Tensor: ...

    @abstractmethod
    def cast(self, x: Tensor, dtype: str) -> Tensor: ...

    @abstractmethod
    def bitcast(self, x: Tensor, dtype: str) -> Tensor:
        """The same bytes read as ``dtype`` of the same width (e.g. bfloat16 <-> int16)."""

    @abstractmethod
    def from_numpy(self, a: Any, like: Tensor) -> Tensor:
        """A tensor on ``like``'s device holding the numpy array ``a`` (dtype kept)."""

    @abstractmethod
    def scalar(self, x: Tensor) -> float:
        """A 0-d or 1-element tensor as a Python float (synchronises with the device)."""

    @abstractmethod
    def to_numpy(self, x: Tensor) -> np.ndarray:
        """The tensor's values on the host (synchronises with the device)."""

    @abstractmethod
    def checksums(self, xs: Sequence[Tensor]) -> Tensor:
        """One int64 per tensor of ``xs`` (any shape and dtype, on one device): the checksum of
        its bits that :mod:`hvdcompress.step.replicas` defines (on the host: CRC-32 and word sum,
        :func:`~hvdcompress.step.replicas.host_checksum`; on a GPU, computed there without a copy)."""

    # --- elementwise and reductions ------------------------------------------------------
    @abstractmethod
    def magnitude(self, x: Tensor) -> Tensor:
        """``|x|`` with NaN mapped to +inf, so selection by magnitude always picks non-finite
        elements and they reach every rank, as they would with a dense allreduce."""

    @abstractmethod
    def where(self, cond: Tensor, a: Tensor, b: Tensor) -> Tensor: ...

    @abstractmethod
    def isfinite(self, x: Tensor) -> Tensor: ...

    @abstractmethod
    def sqrt(self, x: Tensor) -> Tensor: ...

    def norm(self, x: Tensor) -> Tensor:
        """The L2 norm as a 0-d float32 tensor (kernels.h ``l2_norm``: squares summed in
        float64), of ``x`` cast to float32 if it is not."""
        return self._impl(x).l2_norm(self._as_float32(x))

    # --- selection ------------------------------------------------------------------------
    @abstractmethod
    def gather(self, x: Tensor, indices: Tensor) -> Tensor: ...

    @abstractmethod
    def _scatter_add(self, n: int, indices: Tensor, values: Tensor) -> Tensor:
        """:meth:`sparse_sum` for values other than float32, in their dtype: a dense length-``n``
        tensor, zeros plus ``values`` added at the int64 ``indices`` (repeats sum)."""

    @abstractmethod
    def fill_at(self, x: Tensor, indices: Tensor, value: float, non_finite_only: bool = False,
                owned: bool = False) -> Tensor:
        """``x`` with ``x[indices] = value``, or with ``non_finite_only`` only where
        ``x[indices]`` is NaN or ±Inf (kernels.h ``fill_at`` for float32); may work in place and
        return ``x``. ``owned``: ``x`` is the caller's own fresh kernel result, which nothing
        else references yet (no state, no view), so that a backend whose tensors are immutable
        may still fill it in place instead of copying it (TensorFlow: a float32 result of the
        C++ kernels, which wraps their buffer)."""

    @abstractmethod
    def concat(self, xs: Sequence[Tensor]) -> Tensor: ...

    @abstractmethod
    def split(self, x: Tensor, sizes: Sequence[int]) -> list: ...

    # --- state ------------------------------------------------------------------------------
    @abstractmethod
    def write(self, state: dict, key: str, value: Tensor) -> None:
        """Store ``value`` as ``state[key]``, reusing the existing buffer where there is one."""

    @abstractmethod
    def into(self, out: Tensor | None, value: Tensor) -> Tensor:
        """``value`` when ``out`` is None; else ``value`` (cast to ``out``'s dtype) written into
        the caller's buffer ``out`` (same number of elements), and ``out`` returned."""

    def scale_(self, x: Tensor, s: float) -> Tensor:
        """``x * s``; a backend that updates in place (torch) scales ``x`` itself and returns it."""
        return x * s

    def accumulate(self, state: dict, key: str, scale: float, add: Tensor,
                   post: float = 1.0) -> Tensor:
        """``state[key] = (state[key] * scale + add) * post``; returns the new value, which may be
        the state buffer itself (a backend may update in place: do not hand it to a collective)."""
        value = (state[key] * scale + add) * post
        self.write(state, key, value)
        return value

    def zero_non_finite(self, x: Tensor) -> Tensor:
        """``x`` with its non-finite (NaN, ±Inf) elements set to 0, as a new tensor."""
        return self.where(self.isfinite(x), x, self.zeros(self.numel(x), like=x))

    def sub_finite(self, a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
        """``a − b`` with non-finite entries set to 0 (an error-feedback residual), written into
        ``out`` when given (``out`` may be ``a`` or ``b``; kernels.h ``sub_finite`` for float32)."""
        if not all(self._is_flat_float32(t) for t in (a, b)):
            return self.into(out, self.zero_non_finite(a - b))
        if self.numel(a) != self.numel(b):
            raise ValueError(f"sub_finite: a has {self.numel(a)} elements, b has {self.numel(b)}")
        return self._decode(out, self.numel(a), lambda buf: self._impl(a).sub_finite(a, b, out=buf))

    def momentum_correction(self, u: Tensor, v: Tensor, g: Tensor, mu: float,
                            nesterov: bool) -> tuple:
        """DGC's momentum correction, ``(u, v)`` after one step with the local gradient ``g``
        (kernels.h ``momentum_correction``). An in-place backend updates ``u`` and ``v`` in
        place; the caller stores the results with :meth:`write`."""
        if not all(self._is_flat_float32(t) for t in (u, v, g)):
            u = (u + g) * mu if nesterov else u * mu + g
            return u, (v + u) + g if nesterov else v + u
        if not self.numel(u) == self.numel(v) == self.numel(g):
            raise ValueError(f"momentum_correction: u, v and g have {self.numel(u)}, {self.numel(v)} "
                             f"and {self.numel(g)} elements; they must be equal")
        return self._impl(g).momentum_correction(g, u, v, float(mu), bool(nesterov),
                                                 u_out=self._in_place(u), v_out=self._in_place(v))

    # --- shape and linear algebra (PowerSGD) ------------------------------------------------
    @abstractmethod
    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        """``x`` viewed (or copied) with ``shape``; row-major, like numpy.reshape."""

    @abstractmethod
    def matmul(self, a: Tensor, b: Tensor, transpose_a: bool = False,
               transpose_b: bool = False, out: Tensor | None = None) -> Tensor:
        """The matrix product of 2-D tensors ``op(a) @ op(b)``, ``op`` transposing where asked;
        written (row-major) into the flat buffer ``out`` when given, and ``out`` returned."""

    @abstractmethod
    def orthonormalize(self, m: Tensor) -> Tensor:
        """An (rows, r) matrix whose columns are an orthonormal basis of ``m``'s columns'
        span (reduced QR's Q; rows >= r). Deterministic: equal inputs give equal outputs."""

    @abstractmethod
    def outer(self, a: Tensor, b: Tensor) -> Tensor:
        """The flat row-major outer product: ``out[i * len(b) + j] = a[i] * b[j]``."""

    def lowrank_project(self, e: Tensor, g: Tensor, q: Tensor) -> tuple:
        """PowerSGD's first product: ``(m, m q)`` with ``m = e + g`` (e, g: rows × cols; q:
        cols × r; float32; kernels.h ``lowrank_project``). An in-place backend builds ``m`` in
        ``e``."""
        e, g, q = self._lowrank_args(e, g, q)
        return self._impl(e).lowrank_project(e, g, q, out=self._in_place(e))

    def lowrank_project_back(self, m: Tensor, p: Tensor) -> Tensor:
        """``mᵀ p`` (m: rows × cols, p: rows × r; float32), as (cols × r)."""
        m, p = self._lowrank_args(m, p)
        return self._impl(m).lowrank_project_back(m, p)

    def lowrank_residual(self, m: Tensor, p: Tensor, q: Tensor) -> Tensor:
        """``m − p qᵀ`` with non-finite entries set to 0, flattened (row-major): PowerSGD's new
        residual (kernels.h ``lowrank_residual``). An in-place backend computes it in ``m``."""
        m, p, q = self._lowrank_args(m, p, q)
        return self._impl(m).lowrank_residual(m, p, q, out=self._in_place(m))

    def _lowrank_args(self, *mats: Tensor) -> tuple:
        """The matrices, contiguous; each must be a 2-D float32 tensor."""
        for name, t in zip("abc", mats):
            if self.dtype(t) != "float32" or self.ndim(t) != 2:
                raise TypeError(f"low-rank products take 2-D float32 matrices; argument {name} is "
                                f"{self.ndim(t)}-D {self.dtype(t)}")
        return tuple(self.contiguous(t) for t in mats)

    def max_abs(self, x: Tensor) -> Tensor:
        """``max |x|`` as a 0-d float32 tensor; NaN if ``x`` has a NaN; 0 for an empty ``x``
        (kernels.h ``max_abs``; ``x`` cast to float32 if it is not, which is exact for
        float16 and bfloat16)."""
        return self._impl(x).max_abs(self._as_float32(x))

    # --- kernels ------------------------------------------------------------------------------
    # The kernels of hvdcompress/ops/kernels.h, which specifies each of them (semantics, byte
    # layouts, random numbers); docs/kernels.md explains the layers. Their methods are generated
    # from the kernel table (hvdcompress/ops/table.py: each parameter's role says what it must
    # be; hvdcompress.ops.methods), after this class, except those of WRITTEN, written out here. Ops checks the arguments
    # once and hands them to the implementation that ``_impl(x)`` picks for x's device: the C++
    # kernels (hvdcompress.ops.native, through zero-copy views of CPU tensors) or the plain-torch
    # fallback (hvdcompress.ops.torch_fallback), which produce bit-identical results. Common rules:
    #  * ``x`` (and ``residual``) must be contiguous 1-D float32 tensors: another dtype is a
    #    TypeError, another shape or a non-contiguous tensor a ValueError. Codes are uint8.
    #  * Decoders take the payloads of R ranks back to back (allgather order) and return their
    #    float32 sum. Given ``out`` (a contiguous float32 tensor of n elements, not aliasing the
    #    payload), they write the sum into it and return it (:meth:`into` for an immutable one).
    #  * ``key`` (an int in [0, 2**32)) seeds the stochastic operations (kernels.h's
    #    counter-based uniforms, identical on every path).
    #  * State-updating operations return the new state (residual, momenta); an in-place backend
    #    (:attr:`in_place`) writes it into the old buffer. The caller stores it with :meth:`write`.

    #: Whether the kernels may update state buffers (residuals, momenta) in place: true for
    #: torch; false for TensorFlow, whose tensors are immutable.
    in_place: bool = False

    @abstractmethod
    def _impl(self, x: Tensor) -> Any:
        """The kernel implementation for ``x``'s device: an object with the functions of
        :mod:`hvdcompress.ops.native`, on this framework's tensors."""

    @abstractmethod
    def ndim(self, x: Tensor) -> int: ...

    def contiguous(self, x: Tensor) -> Tensor:
        """``x`` with a row-major contiguous layout (a copy only when it is not)."""
        return x

    def is_contiguous(self, x: Tensor) -> bool:
        return True

    def _in_place(self, buf: Tensor) -> Tensor | None:
        """The output buffer for an updated state tensor: ``buf`` itself on an in-place backend."""
        return buf if self.in_place else None

    def host_kernel(self, name: str, x: Tensor) -> bool:
        """Whether ``x``'s kernel implementation has kernel ``name`` and returns host numbers
        (the C++ kernels), not device tensors: for a kernel whose caller decides on its counts
        on the host (DGC's fused selection), a path worth taking only where that costs no read."""
        impl = self._impl(x)
        return not getattr(impl, "DEVICE_SCALARS", False) and hasattr(impl, name)

    def _is_flat_float32(self, x: Tensor) -> bool:
        return self.dtype(x) == "float32" and self.ndim(x) == 1 and self.is_contiguous(x)

    def _as_float32(self, x: Tensor) -> Tensor:
        x = x if self.dtype(x) == "float32" else self.cast(x, "float32")
        return self.contiguous(self.reshape(x, (self.numel(x),)) if self.ndim(x) != 1 else x)

    def _check_x(self, x: Tensor, what: str = "x") -> None:
        roles.flat_float32(self, what, x)

    @staticmethod
    def _check_range(what: str, value: int, low: int, high: int) -> None:
        if not low <= value <= high:
            raise ValueError(f"{what}={value} is out of range; allowed: {low}..{high}")

    def _decode(self, out: Tensor | None, n: int, decode: Any) -> Tensor:
        """``decode(buffer)`` into the caller's ``out``: handed to the kernel on an in-place
        backend (after checking it), else filled from the result with :meth:`into`."""
        if out is None or not self.in_place:
            return self.into(out, decode(None))
        return decode(roles.Out().check(self, "", "out", out, {"n": n}))

    def half_cast(self, x: Tensor, dtype: str) -> Tensor:
        """``x`` cast to the 16-bit float ``dtype`` ("float16" or "bfloat16"): rounded to nearest
        even with the same NaN bits on every path (kernels.h ``half_cast``) when ``x`` is a flat
        float32 tensor, else :meth:`cast`."""
        if dtype not in ("float16", "bfloat16") or not self._is_flat_float32(x):
            return self.cast(x, dtype)
        return self.bitcast(self._impl(x).half_cast(x, dtype == "bfloat16"), dtype)

    def choose(self, cond: Any, a: Scalar, b: Scalar) -> Scalar:
        """``a if cond else b`` for scalars: on the host when ``cond`` is a Python bool (the C++
        kernels' results), else elementwise on the device (:meth:`where`), without a host read."""
        if isinstance(cond, bool):
            return a if cond else b
        like = b if isinstance(a, (int, float)) else a
        return self.where(cond, *(self.reshape(self.zeros(1, like=like), ()) + v
                                  if isinstance(v, (int, float)) else v for v in (a, b)))

    def shared_indices(self, n: int, k: int, key: int, like: Tensor) -> Tensor:
        """``k`` distinct indices of [0, n), ascending int64 on ``like``'s device, the same on
        every rank, path and framework for the same ``key``: one per stratum
        [floor(j·n/k), floor((j+1)·n/k)), at ``lo_j + (uniform24(j, key) · size_j) >> 24``
        (kernels.h's counter-based uniforms), O(k). Here computed with numpy on the host and
        copied to the device (no device read); a backend may compute them on the device (torch
        does)."""
        self._check_range("shared_indices: k", k, 0, n)
        return self.from_numpy(counter_hash.stratified(np.arange(k, dtype=np.int64), n, k, key), like)

    def _scalar_arg(self, impl: Any, value: Scalar) -> Scalar:
        """A scalar argument for ``impl``: kept as a device tensor for an implementation that
        reads scalars on the device (``DEVICE_SCALARS``), else a Python float."""
        if isinstance(value, (int, float)):
            return float(value)
        return value if getattr(impl, "DEVICE_SCALARS", False) else self.scalar(value)

    def sparse_sum(self, n: int, indices: Tensor, values: Tensor,
                   out: Tensor | None = None) -> Tensor:
        """A dense length-``n`` tensor of ``values``' dtype: zeros plus ``values`` added at
        ``indices`` (int32 or int64, repeats summed in order). Float32 values go through the
        kernel (kernels.h ``scatter_add``: an index outside [0, n) is an IndexError raised
        before writing); other dtypes through the framework's own scatter-add."""
        if self.dtype(values) != "float32":
            return self.into(out, self._scatter_add(n, self.cast(indices, "int64"), values))
        self._check_x(values, "values")
        if self.dtype(indices) not in ("int32", "int64"):
            raise TypeError(f"indices must be int32 or int64, got {self.dtype(indices)}")
        if self.numel(indices) != self.numel(values):
            raise ValueError(f"sparse_sum: {self.numel(indices)} indices for {self.numel(values)} values")
        return self._decode(out, n, lambda buf: self._impl(values).sparse_sum(
            int(n), self.contiguous(indices), values, out=buf))


# ---- the kernel methods generated from the kernel table (hvdcompress.ops.methods) --------------
#: The kernels whose Ops method is written out above instead of generated: half_cast takes a
#: dtype name; norm (l2_norm) and max_abs cast any float tensor; sub_finite, momentum_correction
#: and sparse_sum take other dtypes through framework ops (momentum_correction the state first);
#: fill_at is each backend's; the low-rank products take matrices.
WRITTEN = ("half_cast", "l2_norm", "max_abs", "sub_finite", "momentum_correction", "sparse_sum",
           "fill_at", "lowrank_project", "lowrank_project_back", "lowrank_residual")


add_kernel_methods(Ops, WRITTEN)
