"""Triton kernels for the hot operations of ``kernels.h``, with :mod:`hvdcompress.ops.native`'s signatures.

:class:`hvdcompress.ops.torch_ops.TorchOps` uses this module for CUDA tensors when ``triton`` is
importable (``pip install hvdcompress[gpu]``), and for every device with
``TorchOps(kernels="triton")``. Triton compiles the kernels to CUDA; with ``TRITON_INTERPRET=1``
set before triton is imported and while they run, its interpreter runs them on CPU tensors
(numpy), which is how the tests check them on machines without a GPU.

Semantics and byte layouts are those of ``kernels.h``, bit for bit, including the stochastic
codes: element ``i`` under ``key`` draws ``u = (fmix32(uint32(i) * 0x9E3779B1 + key) >> 8) * 2^-24``
(MurmurHash3's finaliser, in 32-bit unsigned arithmetic), as the C++ kernels do, so both give the
same codes for the same key. Float arithmetic is float32 without FMA contraction
(``enable_fp_fusion=False``, as the C++ build's ``-ffp-contract=off``) and divisions are IEEE
round-to-nearest (``div_rn``); min, max, comparisons and the hash are exact in any order. Two
results are sums whose order is the GPU's: ``sign_pack``'s mean and ``ef_sign_pack``'s scale,
accumulated in float64 as in C++ and rounded to float32, so equal to the C++ ones unless the
float64 sums differ across a float32 rounding boundary.

Scalars that the kernels read (thresholds, scales, ``inv``) may be Python numbers or 1-element
tensors on the data's device, so a caller can keep them on the GPU. Results that ``native``
returns as Python numbers (``count_ge``, ``sampled_threshold``) are 0-d tensors on the device here:
nothing in this module reads the device except where an output's size depends on the data
(``select_ge``) and the index check of ``sparse_sum``.

Kernels without a Triton version here (``half_cast``, ``fp16_sum``, exact top-k, norms, PowerSGD's
products, ``fill_at``) are the plain-torch ones (the module's ``__getattr__``), so that this module
implements the whole kernel table (:mod:`hvdcompress.ops.table`).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
import triton
import triton.language as tl

from . import table, torch_fallback
from .layout import check_minmax, packed_bytes
from .table import implements

Tensor = torch.Tensor
Scalar = Union[float, Tensor]

#: True when the kernels were defined under ``TRITON_INTERPRET=1`` (they then run on CPU tensors).
INTERPRETED: bool = bool(triton.knobs.runtime.interpret)

#: Scalar arguments may be device tensors, and scalar results are device tensors (see above).
DEVICE_SCALARS = True

BLOCK = 1024      # elements per program of the elementwise kernels
PACK_BYTES = 128  # output bytes per program of the 1- and 2-bit packers (1024 or 512 elements)
LAUNCH = {"enable_fp_fusion": False}  # no FMA contraction: the C++ results, bit for bit


# ---- device functions --------------------------------------------------------------------------
@triton.jit
def _uniform24(i, key):
    """24 random bits of element ``i`` (int64) under ``key`` (uint32): fmix32(i * 0x9E3779B1 + key) >> 8."""
    h = i.to(tl.uint32) * 0x9E3779B1 + key
    h ^= h >> 16
    h *= 0x85EBCA6B
    h ^= h >> 13
    h *= 0xC2B2AE35
    h ^= h >> 16
    return h >> 8


@triton.jit
def _finite_or_zero(v):
    return tl.where(v - v == 0.0, v, 0.0)


@triton.jit
def _sign_bit_clear(v):
    return (v.to(tl.int32, bitcast=True) >= 0).to(tl.int32)


@triton.jit
def _pack_tile(pid, n, BITS: tl.constexpr, BYTES: tl.constexpr):
    """Element offsets (BYTES x 8/BITS), their mask, and each code's bit shift within its byte."""
    PER: tl.constexpr = 8 // BITS
    byte = pid.to(tl.int64) * BYTES + tl.arange(0, BYTES)
    j = tl.arange(0, PER)
    offs = byte[:, None] * PER + j[None, :]
    return offs, offs < n, (8 - BITS * (j + 1))[None, :]


@triton.jit
def _store_packed(out_ptr, pid, nbytes, codes, shift, BYTES: tl.constexpr):
    """Packs a BYTES x 8/BITS tile of int32 codes (0 where masked) into BYTES bytes."""
    byte = pid.to(tl.int64) * BYTES + tl.arange(0, BYTES)
    packed = tl.sum(codes << shift, axis=1)  # disjoint bits: the sum is the OR
    tl.store(out_ptr + byte, packed.to(tl.uint8), mask=byte < nbytes)


@triton.jit
def _level(r, u, levels, smallest, stretch, NATURAL: tl.constexpr):
    """Stochastic level in [0, levels] of r = |x| * inv with uniform u (kernels.h)."""
    r = tl.where(r >= 0.0, r, 0.0)  # NaN -> 0
    if NATURAL:
        r = tl.where(r > 2.0, 2.0, r)
        b = r.to(tl.int32, bitcast=True)
        p = ((b & 0x7FFFFF) | 0x3F800000).to(tl.float32, bitcast=True) - 1.0  # 2m - 1 of frexp
        big = (b >> 23) - 127 + levels + (u < p).to(tl.int32)
        big = tl.where(big > levels, levels, big)
        small = (u < r * stretch).to(tl.int32)
        level = tl.where(r < smallest, small, big)
    else:
        top = levels + 1.0  # float(levels) + 1
        r = tl.where(r < top, r, top)
        low = r.to(tl.int32).to(tl.float32)  # floor for r >= 0
        level = (low + tl.where(u < r - low, 1.0, 0.0)).to(tl.int32)
        level = tl.where(level < levels, level, levels)
    return level


# ---- signs -------------------------------------------------------------------------------------
@triton.jit
def _sign_pack_kernel(x_ptr, out_ptr, part_ptr, n, nbytes, BYTES: tl.constexpr):
    pid = tl.program_id(0)
    offs, mask, shift = _pack_tile(pid, n, 1, BYTES)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    _store_packed(out_ptr, pid, nbytes, tl.where(mask, _sign_bit_clear(x), 0), shift, BYTES)
    tl.store(part_ptr + pid, tl.sum(tl.sum(tl.abs(x).to(tl.float64), axis=1), axis=0))


@triton.jit
def _ef_add_kernel(x_ptr, res_ptr, out_ptr, part_ptr, n, BLOCK: tl.constexpr):
    """out = p = x + residual; one partial sum of |p| per program."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(x_ptr + offs, mask=mask, other=0.0) + tl.load(res_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, p, mask=mask)
    tl.store(part_ptr + tl.program_id(0), tl.sum(tl.abs(p).to(tl.float64), axis=0))


@triton.jit
def _ef_sign_kernel(res_ptr, scale_ptr, out_ptr, n, nbytes, BYTES: tl.constexpr):
    """Signs of p = residual, packed; residual = p - (bit ? scale : -scale), non-finite -> 0."""
    pid = tl.program_id(0)
    offs, mask, shift = _pack_tile(pid, n, 1, BYTES)
    p = tl.load(res_ptr + offs, mask=mask, other=0.0)
    scale = tl.load(scale_ptr)
    bit = _sign_bit_clear(p)
    tl.store(res_ptr + offs, _finite_or_zero(p - tl.where(bit == 1, scale, -scale)), mask=mask)
    _store_packed(out_ptr, pid, nbytes, tl.where(mask, bit, 0), shift, BYTES)


# ---- 2 bits --------------------------------------------------------------------------------------
@triton.jit
def _twobit_kernel(x_ptr, res_ptr, res_out_ptr, t_ptr, out_ptr, n, nbytes, HAS_RESIDUAL: tl.constexpr,
                   BYTES: tl.constexpr):
    pid = tl.program_id(0)
    offs, mask, shift = _pack_tile(pid, n, 2, BYTES)
    t = tl.load(t_ptr)
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        v = v + tl.load(res_ptr + offs, mask=mask, other=0.0)
    pos = (v >= t).to(tl.int32)
    neg = (v <= -t).to(tl.int32)
    if HAS_RESIDUAL:
        tl.store(res_out_ptr + offs, _finite_or_zero(v - t * (pos - neg).to(tl.float32)), mask=mask)
    codes = 3 * pos + 2 * neg + (v != v).to(tl.int32)
    _store_packed(out_ptr, pid, nbytes, tl.where(mask, codes, 0), shift, BYTES)


# ---- stochastic levels ---------------------------------------------------------------------------
@triton.jit(do_not_specialize=["key"])
def _levels_kernel(x_ptr, inv_ptr, out_ptr, n, levels, smallest, stretch, key,
                   NATURAL: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)
    u = _uniform24(offs, key.to(tl.uint32)).to(tl.float32) * (1.0 / 16777216.0)
    level = _level(tl.abs(v) * tl.load(inv_ptr), u, levels, smallest, stretch, NATURAL)
    code = tl.where(v != v, -128, tl.where(v < 0.0, -level, level))
    tl.store(out_ptr + offs, (code & 0xFF).to(tl.uint8), mask=mask)


@triton.jit(do_not_specialize=["key"])
def _ternary_kernel(x_ptr, inv_ptr, out_ptr, n, nbytes, key, BYTES: tl.constexpr):
    pid = tl.program_id(0)
    offs, mask, shift = _pack_tile(pid, n, 2, BYTES)
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)
    u = _uniform24(offs, key.to(tl.uint32)).to(tl.float32) * (1.0 / 16777216.0)
    level = _level(tl.abs(v) * tl.load(inv_ptr), u, 1, 1.0, 1.0, False)
    codes = tl.where(v != v, 1, level * tl.where(v < 0.0, 2, 3))
    _store_packed(out_ptr, pid, nbytes, tl.where(mask, codes, 0), shift, BYTES)


@triton.jit(do_not_specialize=["key"])
def _natural_kernel(x_ptr, out_ptr, n, key, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    bits = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF
    up = (_uniform24(offs, key.to(tl.uint32)).to(tl.int32) < 2 * (a & 0x7FFFFF)).to(tl.int32)
    e8 = (a >> 23) + up
    c = tl.where(e8 < 27, 0, tl.where(e8 > 152, 127, e8 - 26))
    c = tl.where((a >> 23) == 0, 0, c) | (((bits >> 31) & 1) << 7)
    tl.store(out_ptr + offs, tl.where(a > 0x7F800000, 0x80, c).to(tl.uint8), mask=mask)


# ---- decoders ------------------------------------------------------------------------------------
@triton.jit
def _unpack_sum_kernel(packed_ptr, tables_ptr, scale_ptr, out_ptr, n, nbytes, R,
                       BITS: tl.constexpr, VOTE: tl.constexpr, BYTES: tl.constexpr):
    """out = sum_r tables[r][code_r], or with VOTE, scale * sign(sum_r (bit_r ? 1 : -1))."""
    pid = tl.program_id(0)
    offs, mask, shift = _pack_tile(pid, n, BITS, BYTES)
    byte = pid.to(tl.int64) * BYTES + tl.arange(0, BYTES)
    payload = packed_ptr + byte
    table = tables_ptr
    acc = tl.zeros([BYTES, 8 // BITS], tl.float32)
    for _ in range(R):
        b = tl.load(payload, mask=byte < nbytes, other=0).to(tl.int32)
        code = (b[:, None] >> shift) & ((1 << BITS) - 1)
        if VOTE:
            acc += tl.where(code == 1, 1.0, -1.0)
        else:
            acc += tl.load(table + code, mask=mask, other=0.0)
        payload += nbytes
        table += 1 << BITS
    if VOTE:
        acc = ((acc > 0.0).to(tl.int32) - (acc < 0.0).to(tl.int32)).to(tl.float32) * tl.load(scale_ptr)
    tl.store(out_ptr + offs, acc, mask=mask)


@triton.jit
def _bf16_sum_kernel(bits_ptr, out_ptr, n, R, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    payload = bits_ptr + offs
    acc = tl.zeros([BLOCK], tl.float32)
    for _ in range(R):
        b = tl.load(payload, mask=mask, other=0).to(tl.int32) & 0xFFFF
        acc += (b << 16).to(tl.float32, bitcast=True)
        payload += n
    tl.store(out_ptr + offs, acc, mask=mask)


# ---- min-max, 8 or 4 bits ------------------------------------------------------------------------
@triton.jit
def _minmax_code(v, lo, inv, poisoned, TOP: tl.constexpr):
    y = ((v - lo[:, None]) * inv[:, None] + 12582912.0) - 12582912.0  # rint for 0 <= y < 2^22
    y = tl.where(y < 0.0, 0.0, tl.where(y > TOP, TOP, y))
    return tl.where(poisoned[:, None], 0, y.to(tl.int32))


@triton.jit
def _minmax_pack_kernel(x_ptr, codes_ptr, bounds_ptr, n, chunk, chunks, ROWS: tl.constexpr,
                        COLS: tl.constexpr, BITS: tl.constexpr):
    """ROWS chunks per program, one per row, read COLS elements at a time: min, max and finiteness
    in a first pass, the codes in a second (BITS 4: COLS pairs at a time, the first of each pair
    in the high nibble; chunk even)."""
    c = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rows = c < chunks
    begin = c * chunk
    end = tl.minimum(begin + chunk, n)
    cols = tl.arange(0, COLS)[None, :]
    mn = tl.full([ROWS, COLS], float("inf"), tl.float32)
    mx = tl.full([ROWS, COLS], float("-inf"), tl.float32)
    bad = tl.zeros([ROWS, COLS], tl.int32)
    for c0 in range(0, chunk, COLS):
        offs = begin[:, None] + c0 + cols
        mask = rows[:, None] & (offs < end[:, None])
        v = tl.load(x_ptr + offs, mask=mask, other=0.0)
        mn = tl.where(mask & (v < mn), v, mn)
        mx = tl.where(mask & (v > mx), v, mx)
        bad |= (v * 0.0 != 0.0).to(tl.int32)  # NaN iff v is not finite
    lo = tl.min(mn, axis=1)
    hi = tl.max(mx, axis=1)
    poisoned = tl.max(bad, axis=1) != 0
    span = hi - lo
    TOP: tl.constexpr = (1 << BITS) - 1
    inv = tl.where(span > 0.0, tl.math.div_rn(tl.full([ROWS], TOP, tl.float32), span), 0.0)
    if BITS == 8:
        for c0 in range(0, chunk, COLS):
            offs = begin[:, None] + c0 + cols
            mask = rows[:, None] & (offs < end[:, None])
            q = _minmax_code(tl.load(x_ptr + offs, mask=mask, other=0.0), lo, inv, poisoned, TOP)
            tl.store(codes_ptr + offs, q.to(tl.uint8), mask=mask)
    else:
        for c0 in range(0, chunk, 2 * COLS):
            first = begin[:, None] + c0 + 2 * cols
            mask = rows[:, None] & (first < end[:, None])
            second = mask & (first + 1 < end[:, None])
            high = _minmax_code(tl.load(x_ptr + first, mask=mask, other=0.0), lo, inv, poisoned, TOP)
            low = _minmax_code(tl.load(x_ptr + first + 1, mask=second, other=0.0), lo, inv, poisoned, TOP)
            q = (high << 4) | tl.where(second, low, 0)
            tl.store(codes_ptr + first // 2, q.to(tl.uint8), mask=mask)
    nan = float("nan")
    tl.store(bounds_ptr + 2 * c, tl.where(poisoned, nan, lo), mask=rows)
    tl.store(bounds_ptr + 2 * c + 1, tl.where(poisoned, nan, hi), mask=rows)


@triton.jit
def _sign_runs_kernel(packed_ptr, means_ptr, out_ptr, n, nbytes, run, runs, R, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    byte, shift, c = offs // 8, 7 - (offs % 8), offs // run
    acc = tl.zeros([BLOCK], tl.float32)
    for r in range(R):  # rank order from +0.0, as the C++ kernel
        b = tl.load(packed_ptr + r * nbytes + byte, mask=mask, other=0).to(tl.int32)
        s = tl.load(means_ptr + r * runs + c, mask=mask, other=0.0)
        acc += tl.where(((b >> shift.to(tl.int32)) & 1) == 1, s, -s)
    tl.store(out_ptr + offs, acc, mask=mask)


@triton.jit
def _minmax_unpack_kernel(codes_ptr, bounds_ptr, out_ptr, n, nbytes, chunk, chunks, R, BLOCK: tl.constexpr,
                          BITS: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    pair = 2 * (offs // chunk)
    payload = codes_ptr + (offs if BITS == 8 else offs // 2)
    shift = (4 - 4 * (offs % 2)).to(tl.int32)
    bounds = bounds_ptr + pair
    TOP: tl.constexpr = (1 << BITS) - 1
    acc = tl.zeros([BLOCK], tl.float32)
    for _ in range(R):
        lo = tl.load(bounds, mask=mask, other=0.0)
        hi = tl.load(bounds + 1, mask=mask, other=0.0)
        step = tl.math.div_rn(hi - lo, tl.full([BLOCK], TOP, tl.float32))
        q = tl.load(payload, mask=mask, other=0).to(tl.int32)
        if BITS == 4:
            q = (q >> shift) & 15
        acc += lo + q.to(tl.float32) * step
        payload += nbytes
        bounds += 2 * chunks
    tl.store(out_ptr + offs, acc, mask=mask)


# ---- state updates -------------------------------------------------------------------------------
@triton.jit
def _momentum_kernel(g_ptr, u_ptr, v_ptr, mu_ptr, u_out_ptr, v_out_ptr, n, NESTEROV: tl.constexpr,
                     BLOCK: tl.constexpr):
    """DGC's momentum correction in one pass: u = u mu + g, v = v + u; or (Nesterov)
    u = (u + g) mu, v = (v + u) + g."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    mu = tl.load(mu_ptr)
    if NESTEROV:
        u = (u + g) * mu
        v = (v + u) + g
    else:
        u = u * mu + g
        v = v + u
    tl.store(u_out_ptr + offs, u, mask=mask)
    tl.store(v_out_ptr + offs, v, mask=mask)


@triton.jit
def _sub_finite_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    d = tl.load(a_ptr + offs, mask=mask, other=0.0) - tl.load(b_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, _finite_or_zero(d), mask=mask)


# ---- sparsification ------------------------------------------------------------------------------
@triton.jit
def _selected(x_ptr, t_ptr, offs, mask):
    """(x[offs], whether it is selected: |x| >= t or NaN)."""
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)
    return v, mask & ~(tl.abs(v) < tl.load(t_ptr))


@triton.jit
def _count_kernel(x_ptr, t_ptr, counts_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    _, sel = _selected(x_ptr, t_ptr, offs, offs < n)
    tl.store(counts_ptr + tl.program_id(0), tl.sum(sel.to(tl.int32), axis=0).to(tl.int64))


@triton.jit
def _select_kernel(x_ptr, t_ptr, starts_ptr, values_ptr, indices_ptr, n, BLOCK: tl.constexpr):
    """Writes the selected elements of this program's block from its start, in index order."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v, sel = _selected(x_ptr, t_ptr, offs, offs < n)
    pos = tl.load(starts_ptr + tl.program_id(0)) + tl.cumsum(sel.to(tl.int64), axis=0) - 1
    tl.store(values_ptr + pos, v, mask=sel)
    tl.store(indices_ptr + pos, offs, mask=sel)


@triton.jit
def _radix_histogram_kernel(x_ptr, state_ptr, hist_ptr, start, stride, count,
                            SHIFT: tl.constexpr, FIRST: tl.constexpr, BLOCK: tl.constexpr):
    """Histogram of key bits [SHIFT, SHIFT + 8) over the sampled keys whose higher bits equal the
    prefix found so far (state[0]); keys are bits(|x|) & 0x7FFFFFFF (NaN above +inf)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = i < count
    key = tl.load(x_ptr + start + i * stride, mask=valid, other=0.0).to(tl.int32, bitcast=True) & 0x7FFFFFFF
    if not FIRST:
        valid = valid & ((key >> (SHIFT + 8)) == (tl.load(state_ptr) >> (SHIFT + 8)))
    hist = tl.histogram((key >> SHIFT) & 255, 256, mask=valid)
    bins = tl.arange(0, 256)
    tl.atomic_add(hist_ptr + bins, hist, mask=hist > 0)


@triton.jit
def _radix_select_kernel(state_ptr, hist_ptr, top, SHIFT: tl.constexpr, FIRST: tl.constexpr):
    """Picks the bucket holding the `need`-th largest key (state[1], `top` at first) and narrows
    the prefix (state[0]) and the rank within the bucket."""
    hist = tl.load(hist_ptr + tl.arange(0, 256))
    if FIRST:
        need = top
        prefix = 0
    else:
        need = tl.load(state_ptr + 1)
        prefix = tl.load(state_ptr)
    at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist  # keys in buckets >= b
    bucket = tl.sum((at_or_above >= need).to(tl.int32), axis=0) - 1
    above = tl.sum(tl.where(tl.arange(0, 256) == bucket, at_or_above - hist, 0), axis=0)
    tl.store(state_ptr, prefix | (bucket << SHIFT))
    tl.store(state_ptr + 1, need - above)


@triton.jit
def _segment_sum_kernel(sorted_ptr, values_ptr, out_ptr, m, BLOCK: tl.constexpr):
    """For each run of equal sorted indices, out[index] = 0 + v_0 + v_1 + ... in run order."""
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = p < m
    index = tl.load(sorted_ptr + p, mask=valid, other=-1)
    previous = tl.load(sorted_ptr + p - 1, mask=valid & (p > 0), other=-1)
    head = valid & (index != previous)
    acc = tl.zeros([BLOCK], tl.float32)
    j = p
    active = head
    while tl.sum(active.to(tl.int32), axis=0) > 0:
        acc = tl.where(active, acc + tl.load(values_ptr + j, mask=active, other=0.0), acc)
        j += 1
        following = tl.load(sorted_ptr + j, mask=active & (j < m), other=-1)
        active = active & (following == index)
    tl.store(out_ptr + index, acc, mask=head)


# ---- launchers ----------------------------------------------------------------------------------
# The signatures (hvdcompress.ops.table) and results of hvdcompress.ops.native; the argument
# checks are Ops' (done before the call). Those kept here guard memory: a kernel given a short
# buffer would write past it.
def __getattr__(name: str):
    """The kernels without a Triton version here are the plain-torch ones."""
    if name in table.KERNELS:
        return getattr(torch_fallback, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check_device(t: Tensor) -> None:
    if t.device.type != "cuda" and not INTERPRETED:
        raise ValueError(f"the Triton kernels run on CUDA tensors, got a {t.device.type} tensor; "
                         "CPU tensors run them only under the Triton interpreter (set "
                         "TRITON_INTERPRET=1 before hvdcompress.ops.triton_kernels is imported)")


def _check_size(t: Tensor, n: int, what: str) -> None:
    if t.numel() != n:
        raise ValueError(f"{what} has {t.numel()} elements; {n} are needed")


def _scalar(value: Scalar, like: Tensor) -> Tensor:
    """``value`` as a 1-element float32 tensor on ``like``'s device (a fill, not a host read)."""
    if isinstance(value, Tensor):
        return value.reshape(1).to(device=like.device, dtype=torch.float32)
    return torch.full((1,), float(value), dtype=torch.float32, device=like.device)


def _key(key: int) -> int:
    """The 32-bit key as a signed int32 value (one kernel argument type for every key); the
    kernels read it back as uint32."""
    key &= 0xFFFFFFFF
    return key - (1 << 32) if key >= 1 << 31 else key


def _bytes(n: int, like: Tensor) -> Tensor:
    return torch.empty(n, dtype=torch.uint8, device=like.device)


def _output(out: Optional[Tensor], n: int, like: Tensor, what: str = "out") -> Tensor:
    """The caller's buffer (checked) or a new one."""
    if out is None:
        return torch.empty(n, dtype=torch.float32, device=like.device)
    _check_size(out, n, what)
    return out


def _ranks(t: Tensor, each: int, what: str) -> int:
    """How many payloads of ``each`` elements ``t`` holds back to back (at least one)."""
    if each < 1 or t.numel() == 0 or t.numel() % each:
        raise ValueError(f"{what} has {t.numel()} elements, not a positive multiple of {each}")
    return t.numel() // each


def _pack_grid(n: int, bits: int) -> Tuple[int]:
    return (triton.cdiv(packed_bytes(n, bits), PACK_BYTES),)


def _mean_of_parts(parts: Tensor, n: int) -> Tensor:
    return (parts.sum() / max(1, n)).to(torch.float32).view(1)


@implements
def sign_pack(x: Tensor) -> Tuple[Tensor, Tensor]:
    _check_device(x)
    n, nbytes = x.numel(), packed_bytes(x.numel(), 1)
    out = _bytes(nbytes, x)
    grid = _pack_grid(n, 1)
    parts = torch.zeros(grid[0], dtype=torch.float64, device=x.device)
    if n:
        _sign_pack_kernel[grid](x, out, parts, n, nbytes, BYTES=PACK_BYTES, **LAUNCH)
    return out, _mean_of_parts(parts, n)


@implements
def ef_sign_pack(x: Tensor, residual: Tensor, out: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """``(packed, [scale], new residual)``; the new residual goes into ``out`` (may be ``residual``)."""
    _check_device(x)
    n, nbytes = x.numel(), packed_bytes(x.numel(), 1)
    _check_size(residual, n, "residual")
    res_out = _output(out, n, x, "residual out")
    packed = _bytes(nbytes, x)
    parts = torch.zeros(triton.cdiv(n, BLOCK), dtype=torch.float64, device=x.device)
    if n:
        _ef_add_kernel[(parts.numel(),)](x, residual, res_out, parts, n, BLOCK=BLOCK, **LAUNCH)
    scale = _mean_of_parts(parts, n)
    if n:
        _ef_sign_kernel[_pack_grid(n, 1)](res_out, scale, packed, n, nbytes, BYTES=PACK_BYTES, **LAUNCH)
    return packed, scale, res_out


@implements
def twobit_pack(x: Tensor, threshold: Scalar, residual: Optional[Tensor] = None,
                out: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """``(packed, new residual or None)``; the new residual goes into ``out`` (may be ``residual``)."""
    _check_device(x)
    n, nbytes = x.numel(), packed_bytes(x.numel(), 2)
    res_out = None
    if residual is not None:
        _check_size(residual, n, "residual")
        res_out = _output(out, n, x, "residual out")
    packed = _bytes(nbytes, x)
    if n:
        _twobit_kernel[_pack_grid(n, 2)](x, x if residual is None else residual,
                                         x if res_out is None else res_out, _scalar(threshold, x),
                                         packed, n, nbytes, HAS_RESIDUAL=residual is not None,
                                         BYTES=PACK_BYTES, **LAUNCH)
    return packed, res_out


@implements
def levels_pack(x: Tensor, inv: Scalar, levels: int, natural: bool, key: int) -> Tensor:
    _check_device(x)
    n = x.numel()
    out = _bytes(n, x)
    if n:
        _levels_kernel[(triton.cdiv(n, BLOCK),)](
            x, _scalar(inv, x), out, n, levels, math.ldexp(1.0, 1 - levels),
            math.ldexp(1.0, levels - 1), _key(key), NATURAL=bool(natural), BLOCK=BLOCK, **LAUNCH)
    return out


@implements
def ternary_pack(x: Tensor, inv: Scalar, key: int) -> Tensor:
    _check_device(x)
    n, nbytes = x.numel(), packed_bytes(x.numel(), 2)
    out = _bytes(nbytes, x)
    if n:
        _ternary_kernel[_pack_grid(n, 2)](x, _scalar(inv, x), out, n, nbytes, _key(key),
                                          BYTES=PACK_BYTES, **LAUNCH)
    return out


@implements
def natural_pack(x: Tensor, key: int) -> Tensor:
    _check_device(x)
    n = x.numel()
    out = _bytes(n, x)
    if n:
        _natural_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, _key(key), BLOCK=BLOCK, **LAUNCH)
    return out


@implements
def minmax_pack(x: Tensor, chunk: int, bits: int = 8) -> Tuple[Tensor, Tensor]:
    _check_device(x)
    check_minmax("minmax_pack", chunk, bits)
    n = x.numel()
    chunks = triton.cdiv(n, chunk)
    codes = _bytes(packed_bytes(n, bits), x)
    bounds = torch.empty(2 * chunks, dtype=torch.float32, device=x.device)
    if n:
        cols = min(BLOCK, triton.next_power_of_2(chunk))
        rows = BLOCK // cols
        _minmax_pack_kernel[(triton.cdiv(chunks, rows),)](x, codes, bounds, n, chunk, chunks,
                                                          ROWS=rows, COLS=cols, BITS=bits, **LAUNCH)
    return codes, bounds


# ---- decoders
def _unpack(packed: Tensor, n: int, bits: int, tables: Optional[Tensor], scale: Optional[Scalar],
            out: Optional[Tensor]) -> Tensor:
    """unpack_sum (``tables`` given) or sign_vote (``scale`` given) of R payloads."""
    _check_device(packed)
    nbytes = packed_bytes(n, bits)
    ranks = _ranks(packed, nbytes, "packed")
    if tables is not None:
        _check_size(tables, ranks << bits, "tables")
    out = _output(out, n, packed)
    per_program = PACK_BYTES if bits < 8 else BLOCK
    unread = packed  # the kernel reads the tables or the scale, never both
    _unpack_sum_kernel[(triton.cdiv(nbytes, per_program),)](
        packed, unread if tables is None else tables, unread if scale is None else _scalar(scale, packed),
        out, n, nbytes, ranks, BITS=bits, VOTE=scale is not None, BYTES=per_program, **LAUNCH)
    return out


@implements
def unpack_sum(packed: Tensor, n: int, bits: int, tables: Tensor, out: Optional[Tensor] = None) -> Tensor:
    return _unpack(packed, n, bits, tables, None, out)


@implements
def sign_vote(packed: Tensor, n: int, scale: Scalar, out: Optional[Tensor] = None) -> Tensor:
    return _unpack(packed, n, 1, None, scale, out)


@implements
def bf16_sum(bits: Tensor, n: int, out: Optional[Tensor] = None) -> Tensor:
    _check_device(bits)
    ranks = _ranks(bits, n, "bits")
    out = _output(out, n, bits)
    _bf16_sum_kernel[(triton.cdiv(n, BLOCK),)](bits, out, n, ranks, BLOCK=BLOCK, **LAUNCH)
    return out


@implements
def sign_pack_runs(x: Tensor, run: int) -> Tuple[Tensor, Tensor]:
    """The codes by :func:`sign_pack`'s kernel; the means in torch on the device (double sums)."""
    return sign_pack(x)[0], torch_fallback.run_means(x, run)


@implements
def sign_runs_sum(packed: Tensor, means: Tensor, n: int, run: int, out: Optional[Tensor] = None) -> Tensor:
    _check_device(packed)
    nbytes = packed_bytes(n, 1)
    ranks, runs = _ranks(packed, nbytes, "packed"), triton.cdiv(n, run)
    _check_size(means, runs * ranks, "means")
    out = _output(out, n, packed)
    _sign_runs_kernel[(triton.cdiv(n, BLOCK),)](packed, means, out, n, nbytes, run, runs, ranks,
                                               BLOCK=BLOCK, **LAUNCH)
    return out


@implements
def minmax_unpack_sum(codes: Tensor, bounds: Tensor, n: int, chunk: int, bits: int = 8,
                      out: Optional[Tensor] = None) -> Tensor:
    _check_device(codes)
    check_minmax("minmax_unpack_sum", chunk, bits)
    nbytes = packed_bytes(n, bits)
    ranks, chunks = _ranks(codes, nbytes, "codes"), triton.cdiv(n, chunk)
    _check_size(bounds, 2 * chunks * ranks, "bounds")
    out = _output(out, n, codes)
    _minmax_unpack_kernel[(triton.cdiv(n, BLOCK),)](codes, bounds, out, n, nbytes, chunk, chunks, ranks,
                                                   BLOCK=BLOCK, BITS=bits, **LAUNCH)
    return out


@implements
def sparse_sum(n: int, indices: Tensor, values: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """out = 0, then out[indices[j]] += values[j] in j order, deterministically: a stable sort by
    index, then each run of equal indices summed in order by one thread (no atomics), so every
    rank decoding the same payload gets the same bits, those of the C++ kernel. Reads the
    smallest and largest index from the device once, to raise IndexError before writing."""
    _check_device(values)
    m = indices.numel()
    _check_size(values, m, "values")
    out = _output(out, n, values)
    if m:
        ordered, order = torch.sort(indices, stable=True)
        low, high = torch.stack([ordered[0], ordered[-1]]).tolist()
        if low < 0 or high >= n:
            j = int(torch.nonzero((indices < 0) | (indices >= n))[0])
            raise IndexError(f"scatter_add: index {int(indices[j])} at position {j} is outside [0, {n})")
    out.zero_()
    if m:
        _segment_sum_kernel[(triton.cdiv(m, BLOCK),)](ordered, values[order], out, m, BLOCK=BLOCK, **LAUNCH)
    return out


# ---- state updates
@implements
def momentum_correction(g: Tensor, u: Tensor, v: Tensor, mu: Scalar, nesterov: bool,
                        u_out: Optional[Tensor] = None, v_out: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """``(new u, new v)``, written into ``u_out`` / ``v_out`` (which may be ``u`` / ``v``)."""
    _check_device(g)
    n = g.numel()
    _check_size(u, n, "u")
    _check_size(v, n, "v")
    u_out, v_out = _output(u_out, n, g, "u_out"), _output(v_out, n, g, "v_out")
    if n:
        _momentum_kernel[(triton.cdiv(n, BLOCK),)](g, u, v, _scalar(mu, g), u_out, v_out, n,
                                                   NESTEROV=bool(nesterov), BLOCK=BLOCK, **LAUNCH)
    return u_out, v_out


@implements
def sub_finite(a: Tensor, b: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """``a - b`` with non-finite results 0, into ``out`` (which may be ``a`` or ``b``)."""
    _check_device(a)
    n = a.numel()
    _check_size(b, n, "b")
    out = _output(out, n, a)
    if n:
        _sub_finite_kernel[(triton.cdiv(n, BLOCK),)](a, b, out, n, BLOCK=BLOCK, **LAUNCH)
    return out


# ---- selection
def _block_counts(x: Tensor, t: Tensor) -> Tensor:
    counts = torch.empty(triton.cdiv(x.numel(), BLOCK), dtype=torch.int64, device=x.device)
    if x.numel():
        _count_kernel[(counts.numel(),)](x, t, counts, x.numel(), BLOCK=BLOCK, **LAUNCH)
    return counts


@implements
def count_ge(x: Tensor, threshold: Scalar) -> Tensor:
    """How many elements are selected, as a 0-d int64 tensor on x's device."""
    _check_device(x)
    return _block_counts(x, _scalar(threshold, x)).sum()


@implements
def select_ge(x: Tensor, threshold: Scalar) -> Tuple[Tensor, Tensor]:
    """Reads the total count from the device once: the outputs' size depends on it."""
    _check_device(x)
    threshold = _scalar(threshold, x)
    counts = _block_counts(x, threshold)
    ends = torch.cumsum(counts, 0)
    total = int(ends[-1]) if counts.numel() else 0
    values = torch.empty(total, dtype=torch.float32, device=x.device)
    indices = torch.empty(total, dtype=torch.int64, device=x.device)
    if total:
        _select_kernel[(counts.numel(),)](x, threshold, ends - counts, values, indices, x.numel(),
                                          BLOCK=BLOCK, **LAUNCH)
    return values, indices


@implements
def sampled_threshold(x: Tensor, start: int, stride: int, top: int) -> Tensor:
    """The ``top``-th largest magnitude key of the sample, found by a radix select of 4 passes of 8
    bits (histograms on the device, no host read); a 0-d float32 tensor (NaN keys give NaN)."""
    _check_device(x)
    if stride < 1 or start < 0:
        raise ValueError(f"sampled_threshold: need start >= 0 and stride >= 1, got start={start}, "
                         f"stride={stride}")
    count = triton.cdiv(x.numel() - start, stride) if start < x.numel() else 0
    if not 1 <= top <= count:
        raise ValueError(f"sampled_threshold: top={top} is outside [1, {count}] (the sample count)")
    state = torch.zeros(2, dtype=torch.int32, device=x.device)  # key prefix, rank within it
    hist = torch.zeros((4, 256), dtype=torch.int32, device=x.device)
    for k, shift in enumerate((24, 16, 8, 0)):
        _radix_histogram_kernel[(triton.cdiv(count, BLOCK),)](
            x, state, hist[k], start, stride, count, SHIFT=shift, FIRST=k == 0, BLOCK=BLOCK, **LAUNCH)
        _radix_select_kernel[(1,)](state, hist[k], top, SHIFT=shift, FIRST=k == 0, **LAUNCH)
    return state[0].view(torch.float32)


table.implementation(globals(), complete=False)  # only kernels of the table, checked at import
