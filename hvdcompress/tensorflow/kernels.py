"""The kernels of ``hvdcompress/ops/kernels.h`` in TensorFlow ops (eager or graph).

Semantics and byte layouts are those of :class:`hvdcompress.backend.Ops` and kernels.h; the
deterministic operations give the C++ kernels' results bit for bit. The stochastic ones draw the
C++ kernels' uniforms too (MurmurHash3's finaliser of ``i * 0x9E3779B1 + key`` in uint32
arithmetic), so on CPU they match the C++ kernels (and the torch path using them) code for code.
Argument checking is done by the caller (:class:`hvdcompress.tensorflow.backend.TFOps`).
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import tensorflow as tf

from ..ops.layout import SHIFTS, packed_bytes

Tensor = tf.Tensor

def _pack(codes: Tensor, bits: int) -> Tensor:
    """Integer codes (< 2**bits) packed first-element-in-the-highest-bits, as uint8."""
    per = 8 // bits
    n = int(tf.size(codes))
    padded = tf.pad(tf.cast(codes, tf.int32), [[0, packed_bytes(n, bits) * per - n]])
    shifted = tf.bitwise.left_shift(tf.reshape(padded, [-1, per]), tf.constant(SHIFTS[bits]))
    return tf.cast(tf.reduce_sum(shifted, axis=1), tf.uint8)


def _unpack(packed: Tensor, n: int, bits: int) -> Tensor:
    """The first ``n`` ``bits``-bit codes of ``packed`` as int64."""
    shifted = tf.bitwise.right_shift(tf.reshape(tf.cast(packed, tf.int32), [-1, 1]),
                                     tf.constant(SHIFTS[bits]))
    codes = tf.bitwise.bitwise_and(shifted, (1 << bits) - 1)
    return tf.cast(tf.reshape(codes, [-1])[:n], tf.int64)


def _bits(x: Tensor) -> Tensor:
    return tf.bitcast(x, tf.int32)


def _sign_clear(x: Tensor) -> Tensor:
    """True where the sign bit is clear (+0 and positive NaN included)."""
    return _bits(x) >= 0


def _finite_or_zero(x: Tensor) -> Tensor:
    return tf.where(tf.math.is_finite(x), x, tf.zeros_like(x))


def _mix32(h: Tensor) -> Tensor:
    """MurmurHash3's finaliser on uint32."""
    def shift_xor(v, s):
        return tf.bitwise.bitwise_xor(v, tf.bitwise.right_shift(v, tf.constant(s, tf.uint32)))
    h = shift_xor(h, 16) * tf.constant(0x85EBCA6B, tf.uint32)
    h = shift_xor(h, 13) * tf.constant(0xC2B2AE35, tf.uint32)
    return shift_xor(h, 16)


def _uniform24(n: int, key: int) -> Tensor:
    """The kernels' 24-bit uniform integers for elements 0..n-1, as int32."""
    i = tf.cast(tf.range(n, dtype=tf.int64) & 0xFFFFFFFF, tf.uint32)
    h = _mix32(i * tf.constant(0x9E3779B1, tf.uint32) + tf.constant(key, tf.uint32))
    return tf.cast(tf.bitwise.right_shift(h, tf.constant(8, tf.uint32)), tf.int32)


def _uniform(n: int, key: int) -> Tensor:
    return tf.cast(_uniform24(n, key), tf.float32) * np.float32(1.0 / 16777216.0)


def sign_pack(x: Tensor) -> Tuple[Tensor, Tensor]:
    n = int(tf.size(x))
    mean = tf.reduce_sum(tf.abs(tf.cast(x, tf.float64))) / max(1, n)
    return _pack(tf.cast(_sign_clear(x), tf.int32), 1), tf.reshape(tf.cast(mean, tf.float32), [1])


def ef_sign_pack(x: Tensor, residual: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    p = x + residual
    packed, scale = sign_pack(p)
    sent = tf.where(_sign_clear(p), scale, -scale)
    return packed, scale, _finite_or_zero(p - sent)


def _twobit_codes(v: Tensor, t: float) -> Tensor:
    def as_int(mask):
        return tf.cast(mask, tf.int32)
    return 3 * as_int(v >= t) + 2 * as_int(v <= -t) + as_int(tf.math.is_nan(v))


def twobit_pack(x: Tensor, threshold: float,
                residual: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    v = x if residual is None else x + residual
    packed = _pack(_twobit_codes(v, threshold), 2)
    if residual is None:
        return packed, None
    t = np.float32(threshold)
    sent = t * (tf.cast(v >= t, tf.float32) - tf.cast(v <= -t, tf.float32))
    return packed, _finite_or_zero(v - sent)


def _levels(x: Tensor, inv: float, levels: int, natural: bool, key: int) -> Tensor:
    """Stochastic level in [0, levels] of |x| * inv (kernels.h), as int32."""
    r = tf.abs(x) * np.float32(inv)
    r = tf.where(tf.math.is_nan(r), tf.zeros_like(r), r)
    u = _uniform(int(tf.size(x)), key)
    if natural:
        r = tf.minimum(r, 2.0)
        b = _bits(r)
        p = tf.bitcast(tf.bitwise.bitwise_or(tf.bitwise.bitwise_and(b, 0x7FFFFF), 0x3F800000),
                       tf.float32) - 1.0
        big = tf.minimum(tf.bitwise.right_shift(b, 23) - 127 + levels + tf.cast(u < p, tf.int32),
                         levels)
        small = tf.cast(u < r * np.float32(2.0 ** (levels - 1)), tf.int32)
        return tf.where(r < np.float32(2.0 ** (1 - levels)), small, big)
    r = tf.minimum(r, np.float32(levels + 1.0))
    low = tf.floor(r)
    return tf.minimum(tf.cast(low, tf.int32) + tf.cast(u < r - low, tf.int32), levels)


def levels_pack(x: Tensor, inv: float, levels: int, natural: bool, key: int) -> Tensor:
    level = _levels(x, inv, levels, natural, key)
    code = tf.where(x < 0, -level, level)
    code = tf.where(tf.math.is_nan(x), tf.fill(tf.shape(code), -128), code)
    return tf.bitcast(tf.cast(code, tf.int8), tf.uint8)


def ternary_pack(x: Tensor, inv: float, key: int) -> Tensor:
    level = _levels(x, inv, 1, False, key)
    codes = level * tf.where(x < 0, 2, 3) + tf.cast(tf.math.is_nan(x), tf.int32)
    return _pack(codes, 2)


def natural_pack(x: Tensor, key: int) -> Tensor:
    mag = tf.bitwise.bitwise_and(_bits(x), 0x7FFFFFFF)
    field = tf.bitwise.right_shift(mag, 23)
    u24 = _uniform24(int(tf.size(x)), key)
    up = tf.cast(u24 < 2 * tf.bitwise.bitwise_and(mag, 0x7FFFFF), tf.int32)
    e8 = field + up
    c = tf.where(e8 < 27, 0, tf.where(e8 > 152, 127, e8 - 26))
    c = tf.bitwise.bitwise_or(tf.where(field == 0, 0, c),
                              tf.cast(tf.logical_not(_sign_clear(x)), tf.int32) * 128)
    return tf.cast(tf.where(mag > 0x7F800000, 0x80, c), tf.uint8)


def unpack_sum(packed: Tensor, n: int, bits: int, tables: Tensor) -> Tensor:
    per_rank = packed_bytes(n, bits)
    out = tf.zeros([n], tf.float32)
    ranks = int(tf.size(packed)) // per_rank if per_rank else 0
    for r in range(ranks):
        table = tables[r << bits:(r + 1) << bits]
        out = out + tf.gather(table, _unpack(packed[r * per_rank:(r + 1) * per_rank], n, bits))
    return out


def sign_vote(packed: Tensor, n: int, scale: float) -> Tensor:
    ranks = int(tf.size(packed)) // packed_bytes(n, 1)
    tables = tf.tile(tf.constant([-1.0, 1.0]), [ranks])
    return tf.sign(unpack_sum(packed, n, 1, tables)) * scale


def _rows(x: Tensor, chunk: int) -> list:
    """``x`` as [full chunks (rows), last partial chunk (one row)], leaving out empty parts."""
    n = int(tf.size(x))
    full = n // chunk * chunk
    parts = [tf.reshape(x[:full], [-1, chunk]), tf.reshape(x[full:], [1, -1])]
    return [p for p in parts if int(tf.size(p))]


def minmax_pack(x: Tensor, chunk: int) -> Tuple[Tensor, Tensor]:
    codes, bounds = [], []
    for rows in _rows(x, chunk):
        mn = tf.reduce_min(rows, 1, keepdims=True)
        mx = tf.reduce_max(rows, 1, keepdims=True)
        bad = tf.logical_not(tf.reduce_all(tf.math.is_finite(rows), 1, keepdims=True))
        span = mx - mn
        inv = tf.where(span > 0, np.float32(255.0) / span, tf.zeros_like(span))
        q = tf.clip_by_value(tf.round((rows - mn) * inv), 0.0, 255.0)
        q = tf.where(bad, tf.zeros_like(q), q)
        codes.append(tf.reshape(tf.cast(q, tf.uint8), [-1]))
        pair = tf.concat([mn, mx], 1)
        nan = tf.fill(tf.shape(pair), np.float32(np.nan))
        bounds.append(tf.reshape(tf.where(bad, nan, pair), [-1]))
    return tf.concat(codes, 0), tf.concat(bounds, 0)


def minmax_unpack_sum(codes: Tensor, bounds: Tensor, n: int, chunk: int) -> Tensor:
    chunks = -(-n // chunk)
    out = tf.zeros([n], tf.float32)
    ranks = int(tf.size(codes)) // n if n else 0
    for r in range(ranks):
        pairs = tf.reshape(bounds[2 * chunks * r:2 * chunks * (r + 1)], [chunks, 2])
        decoded, c = [], 0
        for rows in _rows(codes[r * n:(r + 1) * n], chunk):
            m = int(rows.shape[0])
            mn, mx = pairs[c:c + m, 0:1], pairs[c:c + m, 1:2]
            step = (mx - mn) / np.float32(255.0)
            decoded.append(tf.reshape(mn + tf.cast(rows, tf.float32) * step, [-1]))
            c += m
        out = out + tf.concat(decoded, 0)
    return out


def _selected(x: Tensor, t: float) -> Tensor:
    return tf.logical_not(tf.abs(x) < np.float32(t))


def count_ge(x: Tensor, t: float) -> int:
    return int(tf.math.count_nonzero(_selected(x, t)))


def select_ge(x: Tensor, t: float) -> Tuple[Tensor, Tensor]:
    indices = tf.reshape(tf.where(_selected(x, t)), [-1])
    return tf.gather(x, indices), indices


def _keys(x: Tensor) -> Tensor:
    """Magnitude order keys: the bit pattern of |x| (NaN above +inf), as int32."""
    return tf.bitwise.bitwise_and(_bits(x), 0x7FFFFFFF)


def sampled_threshold(x: Tensor, start: int, stride: int, top: int) -> float:
    kth = tf.math.top_k(_keys(x[start::stride]), top).values[-1]
    return float(tf.bitcast(kth, tf.float32))


def topk_abs(x: Tensor, k: int) -> Tuple[Tensor, Tensor]:
    if k == 0:
        return x[:0], tf.zeros([0], tf.int64)
    keys = _keys(x)
    kth = tf.math.top_k(keys, k).values[-1]
    above = tf.reshape(tf.where(keys > kth), [-1])
    ties = tf.reshape(tf.where(keys == kth), [-1])[:k - int(tf.size(above))]
    indices = tf.sort(tf.concat([above, ties], 0))
    return tf.gather(x, indices), indices


def sparse_sum(n: int, indices: Tensor, values: Tensor) -> Tensor:
    indices = tf.cast(indices, tf.int64)
    bad = tf.reshape(tf.where((indices < 0) | (indices >= n)), [-1])
    if int(tf.size(bad)):
        j = int(bad[0])
        raise IndexError(f"sparse_sum: index {int(indices[j])} at position {j} is outside [0, {n})")
    return tf.tensor_scatter_nd_add(tf.zeros([n], tf.float32), tf.expand_dims(indices, 1), values)
