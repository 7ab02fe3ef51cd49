"""The core's :class:`~hvdcompress.ops.facade.Ops` on TensorFlow tensors.

The core's algorithms take Python decisions on tensor values (DGC's threshold adaptation loop,
counts as Python ints, random-k's host-side seeded index draw), so they run eagerly: inside a
``tf.function`` the wrappers call them through ``tf.py_function`` (see
:mod:`hvdcompress.tensorflow.exchange`). Every method here is therefore an eager TensorFlow op,
and :meth:`TFOps.numel`, :meth:`TFOps.count` and :meth:`TFOps.scalar` return Python numbers.

State is written with ``tf.Variable.assign`` when the slot already holds a variable of the
same shape and dtype (:class:`~hvdcompress.tensorflow.state.VariableState` creates one for every
new slot), so checkpoints capture residuals, momenta and velocities.

The kernel operations (:class:`~hvdcompress.ops.facade.Ops` checks their arguments) run on the same
C++ kernels as PyTorch's CPU tensors, through :class:`hvdcompress.ops.native.Bridge`: a tensor
reaches them as a zero-copy numpy view (``np.asarray``; a GPU tensor is copied to the host) and a
result comes back through DLPack without a copy (docs/kernels.md). They need the kernel library
(``pip install --no-build-isolation -e .`` builds it); there is no TensorFlow re-implementation.
"""
from __future__ import annotations

import weakref
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from . import native
from .checksum import host_checksum
from .facade import Ops, Tensor

_BRIDGE: dict = {}
_DLPACK_MIN = 4096  # elements: smaller results are copied (tf.convert_to_tensor), which is cheaper


_BUFFERS: dict = {}  # id(tensor) -> the kernel result it wraps, while the tensor lives


def _wrap(a: np.ndarray) -> Tensor:
    """A TensorFlow tensor of the kernel result ``a``: large aligned ones without a copy (and
    remembered in ``_BUFFERS``, for :meth:`TFOps.fill_at` of an owned result)."""
    if a.size >= _DLPACK_MIN and a.ctypes.data % 64 == 0:
        t = tf.experimental.dlpack.from_dlpack(a.__dlpack__())
        _BUFFERS[id(t)] = a
        weakref.finalize(t, _BUFFERS.pop, id(t), None)
        return t
    return tf.convert_to_tensor(a)


def kernels() -> native.Bridge:
    """The C++ kernels on TensorFlow tensors (built once); ImportError when the kernel library is
    not built."""
    if "bridge" not in _BRIDGE:
        _BRIDGE["bridge"] = native.Bridge(lambda a: isinstance(a, (tf.Tensor, tf.Variable)),
                                          np.asarray, _wrap)
    return _BRIDGE["bridge"]


def _as_int64(indices: Tensor) -> Tensor:
    return tf.cast(indices, tf.int64)


class TFOps(Ops):
    """Eager TensorFlow implementation of the core's array interface (flat 1-D tensors)."""

    name = "tensorflow"

    # --- introspection -------------------------------------------------------------------
    def numel(self, x: Tensor) -> int:
        n = x.shape.num_elements()
        return int(n) if n is not None else int(tf.size(x))

    def ndim(self, x: Tensor) -> int:
        return int(x.shape.rank)

    def _impl(self, x: Tensor) -> native.Bridge:
        return kernels()

    def dtype(self, x: Tensor) -> str:
        return x.dtype.name

    def element_size(self, x: Tensor) -> int:
        return x.dtype.size

    # --- creation and conversion ---------------------------------------------------------
    def zeros(self, n: int, like: Tensor, dtype: str | None = None) -> Tensor:
        return tf.zeros([n], dtype=tf.as_dtype(dtype) if dtype else like.dtype)

    def cast(self, x: Tensor, dtype: str) -> Tensor:
        return tf.cast(x, tf.as_dtype(dtype))

    def bitcast(self, x: Tensor, dtype: str) -> Tensor:
        return tf.bitcast(x, tf.as_dtype(dtype))

    def from_numpy(self, a: Any, like: Tensor) -> Tensor:
        with tf.device(getattr(like, "device", None) or ""):
            return tf.identity(tf.constant(np.ascontiguousarray(a)))

    def scalar(self, x: Tensor) -> float:
        return float(tf.reshape(x, [-1])[0])

    def to_numpy(self, x: Tensor) -> np.ndarray:
        return x.numpy()

    def checksums(self, xs: Sequence[Tensor]) -> Tensor:
        return tf.constant([host_checksum(np.asarray(tf.convert_to_tensor(x))) for x in xs], tf.int64)

    # --- elementwise and reductions ------------------------------------------------------
    def magnitude(self, x: Tensor) -> Tensor:
        a = tf.abs(x)
        return tf.where(tf.math.is_nan(a), tf.constant(np.inf, a.dtype), a)

    def where(self, cond: Tensor, a: Tensor, b: Tensor) -> Tensor:
        return tf.where(cond, a, b)

    def isfinite(self, x: Tensor) -> Tensor:
        return tf.math.is_finite(x)

    def sqrt(self, x: Tensor) -> Tensor:
        return tf.sqrt(x)

    # --- selection ------------------------------------------------------------------------
    def gather(self, x: Tensor, indices: Tensor) -> Tensor:
        return tf.gather(x, indices)

    def _scatter_add(self, n: int, indices: Tensor, values: Tensor) -> Tensor:
        return tf.tensor_scatter_nd_add(tf.zeros([n], values.dtype), tf.expand_dims(indices, 1), values)

    def fill_at(self, x: Tensor, indices: Tensor, value: float, non_finite_only: bool = False,
                owned: bool = False) -> Tensor:
        indices = _as_int64(indices)
        buffer = _BUFFERS.get(id(x)) if owned else None
        if buffer is not None:  # the caller's own kernel result: filled in its buffer, not copied
            native.fill_at(buffer, np.asarray(indices), float(value), out=buffer,
                           non_finite_only=non_finite_only)
            return x
        if self._is_flat_float32(x):
            return self._impl(x).fill_at(x, indices, float(value), non_finite_only=non_finite_only)
        fill = tf.fill(tf.shape(indices), tf.constant(value, x.dtype))
        if non_finite_only:
            sent = tf.gather(x, indices)
            fill = tf.where(tf.math.is_finite(sent), sent, fill)
        return tf.tensor_scatter_nd_update(x, tf.expand_dims(indices, 1), fill)

    def concat(self, xs: Sequence[Tensor]) -> Tensor:
        return tf.concat(list(xs), 0)

    def split(self, x: Tensor, sizes: Sequence[int]) -> list:
        return tf.split(x, list(sizes))

    # --- state ------------------------------------------------------------------------------
    def into(self, out: Optional[Tensor], value: Tensor) -> Tensor:
        if out is None:
            return value
        if not isinstance(out, tf.Variable):
            raise TypeError(f"out must be a tf.Variable (TensorFlow tensors are immutable), got "
                            f"{type(out).__name__}")
        if self.numel(out) != self.numel(value):
            raise ValueError(f"out has {self.numel(out)} elements; the result has {self.numel(value)}")
        out.assign(tf.reshape(tf.cast(value, out.dtype), tf.shape(out)))
        return out

    def write(self, state: dict, key: str, value: Tensor) -> None:
        old = state.get(key)
        if isinstance(old, tf.Variable) and old.shape == value.shape and old.dtype == value.dtype:
            old.assign(value)
        else:
            state[key] = value

    # --- shape and linear algebra (PowerSGD) ------------------------------------------------
    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        return tf.reshape(x, list(shape))

    def matmul(self, a: Tensor, b: Tensor, transpose_a: bool = False,
               transpose_b: bool = False, out: Optional[Tensor] = None) -> Tensor:
        return self.into(out, tf.linalg.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b))

    def orthonormalize(self, m: Tensor) -> Tensor:
        return tf.linalg.qr(m, full_matrices=False).q

    def outer(self, a: Tensor, b: Tensor) -> Tensor:
        return tf.reshape(a[:, None] * b[None, :], [-1])
