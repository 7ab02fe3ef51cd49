"""The array operations a framework provides to the core.

Every algorithm in :mod:`hvdcompress.compressors` is written once, against this small
interface, and runs unchanged on PyTorch tensors (:mod:`hvdcompress.torch.backend`) and TensorFlow
tensors (:mod:`hvdcompress.tensorflow.backend`). Tensors are opaque to the core: it only passes them
to these methods and combines them with ``+``, ``-``, ``*`` and ``/``.

State (residuals, momenta) lives in a plain ``dict`` per tensor; a backend decides how a value is
stored (:meth:`Ops.write`): in place for torch, ``tf.Variable.assign`` for TensorFlow, so the
same algorithm code is checkpointable in both.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

Tensor = Any

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

    # --- elementwise and reductions ------------------------------------------------------
    @abstractmethod
    def abs(self, x: Tensor) -> Tensor: ...

    @abstractmethod
    def magnitude(self, x: Tensor) -> Tensor:
        """``|x|`` with NaN mapped to +inf, so selection by magnitude always picks non-finite
        elements and they reach every rank, as they would with a dense allreduce."""

    @abstractmethod
    def sign(self, x: Tensor) -> Tensor: ...

    @abstractmethod
    def where(self, cond: Tensor, a: Tensor, b: Tensor) -> Tensor: ...

    @abstractmethod
    def isfinite(self, x: Tensor) -> Tensor: ...

    @abstractmethod
    def ge(self, x: Tensor, threshold: Tensor) -> Tensor: ...

    @abstractmethod
    def norm(self, x: Tensor) -> Tensor:
        """The L2 norm as a 0-d tensor, accumulated in float32 or wider."""

    @abstractmethod
    def min(self, x: Tensor) -> Tensor: ...

    @abstractmethod
    def count(self, mask: Tensor) -> int:
        """Number of true elements of a boolean tensor, as a Python int."""

    # --- selection ------------------------------------------------------------------------
    @abstractmethod
    def topk_indices(self, x: Tensor, k: int) -> Tensor:
        """Indices of the ``k`` largest elements of ``x`` (NaN counts as largest), ascending."""

    @abstractmethod
    def topk_values(self, x: Tensor, k: int) -> Tensor:
        """The ``k`` largest values of ``x``, in any order."""

    @abstractmethod
    def nonzero(self, mask: Tensor) -> Tensor:
        """Ascending int64 indices of the true elements of a boolean tensor."""

    @abstractmethod
    def gather(self, x: Tensor, indices: Tensor) -> Tensor: ...

    @abstractmethod
    def strided(self, x: Tensor, start: int, stride: int) -> Tensor:
        """``x[start::stride]``."""

    @abstractmethod
    def scatter_add(self, n: int, indices: Tensor, values: Tensor) -> Tensor:
        """A dense length-``n`` tensor: zeros, plus ``values`` added at ``indices`` (repeats sum)."""

    @abstractmethod
    def fill_at(self, x: Tensor, indices: Tensor, value: float) -> Tensor:
        """``x`` with ``x[indices] = value``; may work in place and return ``x``."""

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

    def accumulate(self, state: dict, key: str, scale: float, add: Tensor,
                   post: float = 1.0) -> Tensor:
        """``state[key] = (state[key] * scale + add) * post``; returns the new value, which may be
        the state buffer itself (a backend may update in place: do not hand it to a collective)."""
        value = (state[key] * scale + add) * post
        self.write(state, key, value)
        return value

    def sub_finite(self, a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
        """``a − b`` with non-finite entries set to 0 (an error-feedback residual), written into
        ``out`` when given (``out`` may be ``a`` or ``b``; one fused pass, kernels.h
        ``sub_finite``)."""
        e = a - b
        return self.into(out, self.where(self.isfinite(e), e, self.zeros(self.numel(e), like=e)))

    def momentum_correction(self, u: Tensor, v: Tensor, g: Tensor, mu: float,
                            nesterov: bool) -> tuple:
        """DGC's momentum correction, ``(u, v)`` after one step with the local gradient ``g``:
        plain ``u = u·mu + g; v = v + u``; Nesterov ``u = (u + g)·mu; v = (v + u) + g``. A
        backend may update ``u`` and ``v`` in place (one fused pass, kernels.h
        ``momentum_correction``); the caller stores the results with :meth:`write`."""
        u = (u + g) * mu if nesterov else u * mu + g
        return u, (v + u) + g if nesterov else v + u

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
        cols × r; float32). A backend may build ``m`` in place in ``e`` in the same pass
        (kernels.h ``lowrank_project``)."""
        m = e + g
        return m, self.matmul(m, q)

    def lowrank_project_back(self, m: Tensor, p: Tensor) -> Tensor:
        """``mᵀ p`` (m: rows × cols, p: rows × r; float32), as (cols × r)."""
        return self.matmul(m, p, transpose_a=True)

    def lowrank_residual(self, m: Tensor, p: Tensor, q: Tensor) -> Tensor:
        """``m − p qᵀ`` (m: rows × cols, p: rows × r, q: cols × r; float32) with non-finite
        entries set to 0, flattened (row-major): PowerSGD's new residual. A backend may compute
        it in place in ``m`` (one fused pass, kernels.h ``lowrank_residual``)."""
        n = self.numel(m)
        return self.sub_finite(self.reshape(m, (n,)), self.reshape(self.matmul(p, q, transpose_b=True), (n,)))

    @abstractmethod
    def max_abs(self, x: Tensor) -> Tensor:
        """``max |x|`` as a 0-d tensor; NaN if ``x`` has a NaN; 0 for an empty ``x``."""

    # --- kernels ------------------------------------------------------------------------------
    # The operations below are the C++ kernels of hvdcompress/ops/kernels.h (where the fuller
    # rules live); a backend may implement them with framework ops. Common rules:
    #  * ``x`` (and ``residual``) must be contiguous float32 of one dimension: another dtype is
    #    a TypeError, a non-contiguous tensor a ValueError. Code tensors are uint8.
    #  * Packed layout: a byte holds 8 / bits codes, the first element in the highest bits
    #    (numpy.packbits order, MXNet's 2-bit order); n codes take ceil(n * bits / 8) bytes and
    #    unused low bits of the last byte are 0.
    #  * Decoders take the payloads of R ranks back to back (allgather order) and return their
    #    float32 sum, added in rank order from +0.0. Given ``out`` (a contiguous float32 tensor
    #    of n elements, not aliasing the payload), they write the sum into it and return it,
    #    so a caller can decode straight into a gradient buffer without allocating.
    #  * ``key`` (an int in [0, 2**32)) seeds the stochastic operations: with the C++ kernels the
    #    uniform for element i is (fmix32(uint32(i) * 0x9E3779B1 + key) >> 8) / 2**24 (MurmurHash3
    #    finaliser). A framework fallback may draw its own uniforms from ``key``: the rounding
    #    rule, not the stream, is the contract.
    #  * Residual-updating operations may update ``residual`` in place; they return the
    #    updated residual, which the caller stores with :meth:`write`.

    @abstractmethod
    def sign_pack(self, x: Tensor) -> tuple:
        """``(packed, mean_abs)``: 1-bit codes, bit = 1 iff the sign bit of x[i] is clear
        (+0 -> 1, -0 -> 0), and ``[mean |x|]`` as a 1-element float32 tensor (NaN if x has NaN)."""

    @abstractmethod
    def ef_sign_pack(self, x: Tensor, residual: Tensor) -> tuple:
        """EF-signSGD in one pass: ``p = x + residual``; ``scale = mean |p|``; signs of ``p``
        packed as :meth:`sign_pack`; ``residual = p - (bit ? scale : -scale)`` with non-finite
        entries set to 0. Returns ``(packed, [scale], residual)``."""

    @abstractmethod
    def twobit_pack(self, x: Tensor, threshold: float, residual: Tensor | None = None) -> tuple:
        """MXNet 2-bit quantisation. ``v = x + residual`` (or ``x``); code 0b11 if v >= t,
        0b10 if v <= -t, 0b01 if v is NaN, else 0b00. With a residual:
        ``residual = v - (+t, -t or 0)``, non-finite entries set to 0. Returns
        ``(packed, residual or None)``. Decode with :meth:`unpack_sum` and the table
        ``[0, nan, -t, +t]``."""

    @abstractmethod
    def levels_pack(self, x: Tensor, scale: float, levels: int, natural: bool, key: int) -> Tensor:
        """Stochastic rounding of ``r = |x[i]| * scale`` (float32) to a level in [0, levels]
        (1 <= levels <= 127), one uint8 per element: the level as two's-complement int8,
        negated when x[i] < 0; 0x80 marks NaN. Linear: levels are the integers, the level is
        floor(r) + (u < r - floor(r)). Natural: nonzero levels are 2^(j - levels), j = 1..levels;
        for r >= 2^(1 - levels), with r = m * 2^e (frexp), the level is (e + levels - 1) +
        (u < 2m - 1); below, it is (u < r * 2^(levels - 1)). Levels are clamped to ``levels``.
        Unbiased when r <= levels (linear) or r <= 1 (natural)."""

    @abstractmethod
    def ternary_pack(self, x: Tensor, scale: float, key: int) -> Tensor:
        """:meth:`levels_pack` with ``levels=1`` (linear), written as 2-bit codes in the
        :meth:`twobit_pack` format (+1 -> 0b11, -1 -> 0b10, 0 -> 0b00, NaN -> 0b01)."""

    @abstractmethod
    def natural_pack(self, x: Tensor, key: int) -> Tensor:
        """Natural compression: |x| in [2^E, 2^(E+1)) becomes 2^(E+1) with probability
        |x| / 2^E - 1, else 2^E (unbiased). One uint8 per element: bit 7 the sign bit of x,
        bits 0-6 c: 0 -> 0 (results below 2^-100, zeros and subnormals), 1..126 ->
        2^(c - 101), 127 -> infinity (results of 2^26 or more). NaN -> 0x80."""

    @abstractmethod
    def unpack_sum(self, packed: Tensor, n: int, bits: int, tables: Tensor,
                   out: Tensor | None = None) -> Tensor:
        """Decode R payloads of ``n`` ``bits``-bit codes (bits in 1, 2, 8; payload r starts at
        byte r * ceil(n * bits / 8)) through per-rank float32 tables (R * 2^bits entries, table
        r at offset r * 2^bits) and sum: ``out[i] = sum_r tables[r][code_r(i)]``."""

    @abstractmethod
    def bf16_sum(self, bits: Tensor, n: int, out: Tensor | None = None) -> Tensor:
        """Decode and sum R payloads of ``n`` bfloat16 values given as int16 bit patterns (back
        to back): ``out[i] = sum_r float32(bits_r[i])``, in rank order from +0.0."""

    @abstractmethod
    def sign_vote(self, packed: Tensor, n: int, scale: float, out: Tensor | None = None) -> Tensor:
        """Majority vote of R :meth:`sign_pack` payloads (back to back): float32
        ``scale * sign(sum_r (bit ? 1 : -1))``, 0 where the ranks tie."""

    @abstractmethod
    def minmax_pack(self, x: Tensor, chunk: int) -> tuple:
        """Bagua's 8-bit min-max quantisation per chunk of ``chunk`` elements (the last may be
        shorter). Returns ``(codes, bounds)``: n uint8 codes and float32 bounds
        ``[min_0, max_0, min_1, max_1, ...]`` (both NaN for a chunk holding a non-finite
        value). In float32: ``range = max - min``; ``inv = 255 / range`` (0 if range is 0);
        ``code = clamp(rint((x - min) * inv), 0, 255)`` (half to even; 0 in a NaN chunk)."""

    @abstractmethod
    def minmax_unpack_sum(self, codes: Tensor, bounds: Tensor, n: int, chunk: int,
                          out: Tensor | None = None) -> Tensor:
        """Sum over R payloads (``codes`` R * n bytes, ``bounds`` R * 2 * ceil(n / chunk)
        floats) of ``min + code * (range / 255)``, in float32."""

    @abstractmethod
    def count_ge(self, x: Tensor, threshold: float) -> int:
        """How many elements are selected: |x[i]| >= threshold, or x[i] is NaN."""

    @abstractmethod
    def select_ge(self, x: Tensor, threshold: float) -> tuple:
        """``(values, indices)`` of the elements :meth:`count_ge` selects, indices ascending
        int64, in one compaction."""

    @abstractmethod
    def sampled_threshold(self, x: Tensor, start: int, stride: int, top: int) -> float:
        """The ``top``-th largest magnitude (1-based) among ``x[start::stride]``; NaN ranks above
        +inf (and is returned as NaN). 1 <= top <= the sample count."""

    @abstractmethod
    def topk_abs(self, x: Tensor, k: int) -> tuple:
        """Exact top-k by magnitude: ``(values, indices)`` of the k elements of largest |x|
        (NaN largest, then +inf), ties broken towards the lower index, indices ascending int64.
        0 <= k <= numel(x)."""

    @abstractmethod
    def sparse_sum(self, n: int, indices: Tensor, values: Tensor,
                   out: Tensor | None = None) -> Tensor:
        """A dense float32 length-``n`` tensor: zeros plus ``values`` (float32) added at
        ``indices`` (int32 or int64, repeats summed in order), e.g. the allgathered sparse
        payloads of all ranks. An index outside [0, n) is an IndexError raised before writing."""
