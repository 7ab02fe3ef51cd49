"""The core's :class:`~hvdcompress.backend.Ops` on TensorFlow tensors.

The core's algorithms take Python decisions on tensor values (DGC's threshold adaptation loop,
counts as Python ints, random-k's host-side seeded index draw), so they run eagerly: inside a
``tf.function`` the wrappers call them through ``tf.py_function`` (see
:mod:`hvdcompress.tensorflow.exchange`). Every method here is therefore an eager TensorFlow op,
and :meth:`TFOps.numel`, :meth:`TFOps.count` and :meth:`TFOps.scalar` return Python numbers.

State is written with ``tf.Variable.assign`` when the slot already holds a variable of the
same shape and dtype (:class:`~hvdcompress.tensorflow.state.VariableState` creates one for every
new slot), so checkpoints capture residuals, momenta and velocities.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from ..backend import Ops, Tensor
from . import kernels


def _check_x(x: Tensor, what: str = "x") -> None:
    """The kernels take 1-D float32 tensors (TensorFlow tensors are always contiguous)."""
    if x.dtype != tf.float32:
        raise TypeError(f"{what} must be a float32 tensor, got {x.dtype.name}")
    if x.shape.rank != 1:
        raise ValueError(f"{what} must be a 1-D tensor, got shape {tuple(x.shape)}")


def _as_int64(indices: Tensor) -> Tensor:
    return tf.cast(indices, tf.int64)


class TFOps(Ops):
    """Eager TensorFlow implementation of the core's array interface (flat 1-D tensors)."""

    name = "tensorflow"

    # --- introspection -------------------------------------------------------------------
    def numel(self, x: Tensor) -> int:
        n = x.shape.num_elements()
        return int(n) if n is not None else int(tf.size(x))

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

    # --- elementwise and reductions ------------------------------------------------------
    def abs(self, x: Tensor) -> Tensor:
        return tf.abs(x)

    def magnitude(self, x: Tensor) -> Tensor:
        a = tf.abs(x)
        return tf.where(tf.math.is_nan(a), tf.constant(np.inf, a.dtype), a)

    def sign(self, x: Tensor) -> Tensor:
        return tf.sign(x)

    def where(self, cond: Tensor, a: Tensor, b: Tensor) -> Tensor:
        return tf.where(cond, a, b)

    def isfinite(self, x: Tensor) -> Tensor:
        return tf.math.is_finite(x)

    def ge(self, x: Tensor, threshold: Tensor) -> Tensor:
        return x >= threshold

    def norm(self, x: Tensor) -> Tensor:
        wide = tf.float64 if x.dtype == tf.float64 else tf.float32
        return tf.norm(tf.cast(x, wide))

    def min(self, x: Tensor) -> Tensor:
        return tf.reduce_min(x)

    def count(self, mask: Tensor) -> int:
        return int(tf.math.count_nonzero(mask))

    # --- selection ------------------------------------------------------------------------
    def topk_indices(self, x: Tensor, k: int) -> Tensor:
        return tf.sort(_as_int64(tf.math.top_k(x, k, sorted=False).indices))

    def topk_values(self, x: Tensor, k: int) -> Tensor:
        return tf.math.top_k(x, k, sorted=False).values

    def nonzero(self, mask: Tensor) -> Tensor:
        return tf.reshape(tf.where(mask), [-1])

    def gather(self, x: Tensor, indices: Tensor) -> Tensor:
        return tf.gather(x, indices)

    def strided(self, x: Tensor, start: int, stride: int) -> Tensor:
        return x[start::stride]

    def scatter_add(self, n: int, indices: Tensor, values: Tensor) -> Tensor:
        return tf.tensor_scatter_nd_add(tf.zeros([n], values.dtype),
                                        tf.expand_dims(_as_int64(indices), 1), values)

    def fill_at(self, x: Tensor, indices: Tensor, value: float) -> Tensor:
        fill = tf.fill(tf.shape(indices), tf.constant(value, x.dtype))
        return tf.tensor_scatter_nd_update(x, tf.expand_dims(_as_int64(indices), 1), fill)

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

    def max_abs(self, x: Tensor) -> Tensor:
        if self.numel(x) == 0:
            return tf.zeros([], x.dtype)
        top = tf.reduce_max(tf.abs(x))
        return tf.where(tf.reduce_any(tf.math.is_nan(x)), tf.constant(np.nan, x.dtype), top)

    # --- kernels (TensorFlow ops, see hvdcompress.tensorflow.kernels) -------------------------
    def sign_pack(self, x: Tensor) -> tuple:
        _check_x(x)
        return kernels.sign_pack(x)

    def ef_sign_pack(self, x: Tensor, residual: Tensor) -> tuple:
        _check_x(x)
        _check_x(residual, "residual")
        return kernels.ef_sign_pack(x, residual)

    def twobit_pack(self, x: Tensor, threshold: float, residual: Tensor | None = None) -> tuple:
        _check_x(x)
        if residual is not None:
            _check_x(residual, "residual")
        return kernels.twobit_pack(x, float(threshold), residual)

    def levels_pack(self, x: Tensor, scale: float, levels: int, natural: bool, key: int) -> Tensor:
        _check_x(x)
        if not 1 <= levels <= 127:
            raise ValueError(f"levels_pack: levels={levels} is out of range; allowed: 1..127")
        return kernels.levels_pack(x, float(scale), int(levels), bool(natural), int(key))

    def ternary_pack(self, x: Tensor, scale: float, key: int) -> Tensor:
        _check_x(x)
        return kernels.ternary_pack(x, float(scale), int(key))

    def natural_pack(self, x: Tensor, key: int) -> Tensor:
        _check_x(x)
        return kernels.natural_pack(x, int(key))

    def bf16_sum(self, bits: Tensor, n: int, out: Optional[Tensor] = None) -> Tensor:
        if bits.dtype != tf.int16:
            raise TypeError(f"bits must be an int16 tensor, got {bits.dtype.name}")
        if n < 1 or self.numel(bits) == 0 or self.numel(bits) % n:
            raise ValueError(f"bf16_sum: bits has {self.numel(bits)} elements, not a positive "
                             f"multiple of n={n}")
        values = tf.reshape(tf.cast(tf.bitcast(bits, tf.bfloat16), tf.float32), [-1, n])
        total = tf.zeros([n], tf.float32)
        for r in range(self.numel(bits) // n):  # rank order, as the kernel
            total = total + values[r]
        return self.into(out, total)

    def sign_vote(self, packed: Tensor, n: int, scale: float, out: Optional[Tensor] = None) -> Tensor:
        return self.into(out, kernels.sign_vote(packed, int(n), float(scale)))

    def unpack_sum(self, packed: Tensor, n: int, bits: int, tables: Tensor,
                   out: Optional[Tensor] = None) -> Tensor:
        if bits not in (1, 2, 8):
            raise ValueError(f"unpack_sum: bits={bits} is out of range; allowed: 1, 2, 8")
        return self.into(out, kernels.unpack_sum(packed, int(n), int(bits), tables))

    def minmax_pack(self, x: Tensor, chunk: int) -> tuple:
        _check_x(x)
        return kernels.minmax_pack(x, int(chunk))

    def minmax_unpack_sum(self, codes: Tensor, bounds: Tensor, n: int, chunk: int,
                          out: Optional[Tensor] = None) -> Tensor:
        return self.into(out, kernels.minmax_unpack_sum(codes, bounds, int(n), int(chunk)))

    def count_ge(self, x: Tensor, threshold: float) -> int:
        _check_x(x)
        return kernels.count_ge(x, float(threshold))

    def select_ge(self, x: Tensor, threshold: float) -> tuple:
        _check_x(x)
        return kernels.select_ge(x, float(threshold))

    def sampled_threshold(self, x: Tensor, start: int, stride: int, top: int) -> float:
        _check_x(x)
        return kernels.sampled_threshold(x, int(start), int(stride), int(top))

    def topk_abs(self, x: Tensor, k: int) -> tuple:
        _check_x(x)
        if not 0 <= k <= self.numel(x):
            raise ValueError(f"topk_abs: k={k} is out of range; allowed: 0..{self.numel(x)} "
                             "(the tensor's size)")
        return kernels.topk_abs(x, int(k))

    def sparse_sum(self, n: int, indices: Tensor, values: Tensor,
                   out: Optional[Tensor] = None) -> Tensor:
        _check_x(values, "values")
        if indices.dtype not in (tf.int32, tf.int64):
            raise TypeError(f"indices must be int32 or int64, got {indices.dtype.name}")
        if self.numel(indices) != self.numel(values):
            raise ValueError(f"sparse_sum: {self.numel(indices)} indices for "
                             f"{self.numel(values)} values")
        return self.into(out, kernels.sparse_sum(int(n), indices, values))
