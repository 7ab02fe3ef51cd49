"""RandomK's shared indices in plain Python integers (no numpy vectorising, no torch): the
reference that the device (torch) and host (numpy, TensorFlow) versions must equal bit for bit."""
from __future__ import annotations

import numpy as np


def fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finaliser."""
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def strata(n: int, k: int) -> list:
    """The k strata of [0, n) as (first index, size)."""
    return [(j * n // k, (j + 1) * n // k - j * n // k) for j in range(k)]


def np_shared_indices(n: int, k: int, key: int) -> np.ndarray:
    """One index per stratum: first + floor(u * size) with u = (fmix32(j * 0x9E3779B1 + key) >> 8) / 2**24."""
    return np.array([first + ((fmix32((j * 0x9E3779B1 + key) & 0xFFFFFFFF) >> 8) * size >> 24)
                     for j, (first, size) in enumerate(strata(n, k))], dtype=np.int64)
