"""kernels.h's counter-based hash in Python, defined once for torch tensors and numpy arrays.

Element i under a 32-bit ``key`` draws ``fmix32(uint32(i) · 0x9E3779B1 + key) >> 8``, 24 random
bits (fmix32: MurmurHash3's finaliser), the same in C++ (kernels.h), Triton
(triton_kernels.py) and here; so every path, rank and device draws the same numbers from
``(key, i)`` alone. The functions take an int64 index array (``torch.arange`` on a device, or
``np.arange``) and use only ``&``, ``>>``, ``<<``, ``^``, ``+``, ``*`` and ``//``, which both
libraries define alike on int64; products stay below 2^63.
"""
from __future__ import annotations

from typing import Any

GOLDEN, M1, M2, LOW32 = 0x9E3779B1, 0x85EBCA6B, 0xC2B2AE35, 0xFFFFFFFF


def _mul32(h: Any, c: int) -> Any:
    """``h * c mod 2^32`` for int64 ``h`` in [0, 2^32), without int64 overflow: with
    h = hi * 2^16 + lo, the product is lo * c + ((hi * c) mod 2^16) * 2^16 (mod 2^32)."""
    lo, hi = h & 0xFFFF, h >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & LOW32


def uniform24(i: Any, key: int) -> Any:
    """The 24-bit uniforms (int64) of the int64 indices ``i`` under ``key``."""
    h = (_mul32(i & LOW32, GOLDEN) + (key & LOW32)) & LOW32
    h = _mul32(h ^ (h >> 16), M1)
    h = _mul32(h ^ (h >> 13), M2)
    return (h ^ (h >> 16)) >> 8


def stratified(j: Any, n: int, k: int, key: int) -> Any:
    """RandomK's indices for ``j = arange(k)`` (int64): stratum j is [lo_j, lo_{j+1}) with
    lo_j = floor(j·n/k), and its index is ``lo_j + (uniform24(j, key) · size_j) >> 24``:
    k distinct indices of [0, n), ascending, in O(k)."""
    lo = j * n // k if k else j
    return lo + ((uniform24(j, key) * ((j + 1) * n // max(k, 1) - lo)) >> 24)
