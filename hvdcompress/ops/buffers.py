"""The numpy buffers of the C++ kernels: 64-byte aligned, large ones recycled (:func:`empty`),
and the checks that keep a wrong buffer from reaching C++ (:func:`pointer`, :func:`writable`,
:func:`out_buffer`)."""
from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np

Array = np.ndarray
_ALIGN = 64  # TensorFlow wraps a buffer without copying only when it is this aligned
_POOL: dict = {}  # byte size -> raw buffers handed out before (see empty)
_POOL_MIN = 1 << 20  # bytes: smaller buffers come from malloc's free lists anyway
_POOL_PER_SIZE = 4
_POOL_MAX_BYTES = 1 << 30
_POOL_BYTES = [0]


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


def pointer(a: Array, dtype: Any, what: str, n: Optional[int] = None) -> int:
    """The address of ``a``'s buffer after checking that ``a`` is a C-contiguous numpy array of
    ``dtype`` (and ``n`` elements)."""
    if not isinstance(a, np.ndarray) or a.dtype != np.dtype(dtype) or not a.flags.c_contiguous:
        raise TypeError(f"{what} must be a C-contiguous {np.dtype(dtype).name} array, got "
                        f"{getattr(a, 'dtype', type(a).__name__)}")
    if n is not None and a.size != n:
        raise ValueError(f"{what} has {a.size} elements; {n} are needed")
    return a.ctypes.data


def writable(a: Array, what: str) -> Array:
    if not a.flags.writeable:
        raise ValueError(f"{what} is read-only")
    return a


def out_buffer(out: Optional[Array], n: int, dtype: Any, what: str = "out") -> Array:
    """The caller's output buffer (checked) or a new aligned one."""
    if out is None:
        return empty(n, dtype)
    pointer(writable(out, what), dtype, what, n)
    return out
