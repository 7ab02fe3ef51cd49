"""The core's :class:`~hvdcompress.backend.Ops` on PyTorch tensors (any device).

The kernel operations run on the C++ extension ``hvdcompress.ops._torch_kernels`` for CPU
tensors when it is built, and on the plain-torch fallback :mod:`hvdcompress.ops.torch_fallback`
otherwise (other devices, extension missing, or ``HVDCOMPRESS_DISABLE_KERNELS=1``). Which path is
in use is logged once, on the ``hvdcompress`` logger.
"""
from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import Any, Optional, Sequence

import numpy as np
import torch

from ..backend import Ops
from ..ops import torch_fallback

log = logging.getLogger("hvdcompress")
_LOADED: dict = {}

_DTYPES = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
    "float64": torch.float64, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def dtype_name(dt: torch.dtype) -> str:
    return _NAMES.get(dt, str(dt).replace("torch.", ""))


def load_kernels() -> Optional[ModuleType]:
    """The C++ extension, or None when it is not built or HVDCOMPRESS_DISABLE_KERNELS=1.
    Logs the outcome once per process."""
    if "module" not in _LOADED:
        module, reason = None, "HVDCOMPRESS_DISABLE_KERNELS=1"
        if os.environ.get("HVDCOMPRESS_DISABLE_KERNELS", "0") != "1":
            try:
                from ..ops import _torch_kernels as module  # type: ignore[attr-defined]
            except ImportError as exc:
                reason = f"the C++ extension is not built ({exc})"
        if module is not None:
            log.info("using the C++ kernels (%s)", module.__file__)
        else:
            log.warning("%s; using the pure-torch fallback kernels", reason)
        _LOADED["module"] = module
    return _LOADED["module"]


def _check_x(x: torch.Tensor, what: str = "x") -> None:
    if x.dtype != torch.float32:
        raise TypeError(f"{what} must be a float32 tensor, got {dtype_name(x.dtype)}")
    if x.dim() != 1 or not x.is_contiguous():
        raise ValueError(f"{what} must be a contiguous 1-D tensor, got shape {tuple(x.shape)} "
                         f"with strides {x.stride()}")


def _checked_out(out: Optional[torch.Tensor], n: int) -> Optional[torch.Tensor]:
    """A decoder's output buffer: None, or a contiguous 1-D float32 tensor of ``n`` elements."""
    if out is not None:
        _check_x(out, "out")
        if out.numel() != n:
            raise ValueError(f"out has {out.numel()} elements; the decoded tensor has {n}")
    return out


class TorchOps(Ops):
    """``kernels``: None picks the C++ kernels when available (see :func:`load_kernels`); True
    requires them (ImportError otherwise); False always uses the plain-torch fallback."""

    name = "torch"

    def __init__(self, kernels: Optional[bool] = None):
        module = load_kernels() if kernels is not False else None
        if kernels and module is None:
            raise ImportError("TorchOps(kernels=True): the C++ kernels are not available; build "
                              "them with `pip install --no-build-isolation -e .` and unset "
                              "HVDCOMPRESS_DISABLE_KERNELS")
        self._kernels = module

    @property
    def uses_kernels(self) -> bool:
        return self._kernels is not None

    def _impl(self, x: torch.Tensor) -> Any:
        return self._kernels if self._kernels is not None and x.device.type == "cpu" else torch_fallback

    def numel(self, x): return x.numel()
    def dtype(self, x): return dtype_name(x.dtype)
    def element_size(self, x): return x.element_size()

    def zeros(self, n, like, dtype=None):
        return torch.zeros(n, dtype=_DTYPES[dtype] if dtype else like.dtype, device=like.device)

    def cast(self, x, dtype):
        return x.to(_DTYPES[dtype])

    def bitcast(self, x, dtype):
        return x.view(_DTYPES[dtype])

    def from_numpy(self, a, like):
        return torch.from_numpy(np.ascontiguousarray(a)).to(like.device)

    def scalar(self, x): return float(x)

    def abs(self, x): return x.abs()

    def magnitude(self, x):
        return x.abs().nan_to_num_(nan=float("inf"))

    def sign(self, x): return x.sign()
    def where(self, cond, a, b): return torch.where(cond, a, b)
    def isfinite(self, x): return torch.isfinite(x)
    def ge(self, x, threshold): return x >= threshold
    def norm(self, x): return torch.linalg.vector_norm(x, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
    def min(self, x): return x.min()
    def count(self, mask): return int(mask.sum())

    def topk_indices(self, x, k):
        return torch.topk(x, k, sorted=False).indices.sort().values

    def topk_values(self, x, k):
        return torch.topk(x, k, sorted=False).values

    def nonzero(self, mask): return torch.nonzero(mask).view(-1)
    def gather(self, x, indices): return x[indices]
    def strided(self, x, start, stride): return x[start::stride]

    def scatter_add(self, n, indices, values):
        out = torch.zeros(n, dtype=values.dtype, device=values.device)
        return out.index_add_(0, indices, values)

    def fill_at(self, x, indices, value):
        indices = indices.long()
        if x.dtype == torch.float32 and x.dim() == 1 and x.is_contiguous():
            return self._impl(x).fill_at(x, indices.contiguous(), float(value))
        return x.index_fill_(0, indices, value)

    def concat(self, xs: Sequence[Any]): return torch.cat(list(xs))

    def split(self, x, sizes): return list(torch.split(x, list(sizes)))

    def into(self, out, value):
        if out is None:
            return value
        if value.numel() != out.numel():
            raise ValueError(f"out has {out.numel()} elements; the result has {value.numel()}")
        if out.data_ptr() != value.data_ptr() or out.dtype != value.dtype:
            out.copy_(value.reshape(out.shape))
        return out

    def sub_finite(self, a, b, out=None):
        flat = [a, b] + ([out] if out is not None else [])
        if not all(t.dtype == torch.float32 and t.is_contiguous() and t.dim() == 1 for t in flat):
            return super().sub_finite(a, b, out)
        if a.numel() != b.numel() or (out is not None and out.numel() != a.numel()):
            raise ValueError(f"sub_finite: a, b and out have {a.numel()}, {b.numel()} and "
                             f"{out.numel() if out is not None else a.numel()} elements; they must be equal")
        return self._impl(a).sub_finite(a, b, out)

    def momentum_correction(self, u, v, g, mu, nesterov):
        if all(t.dtype == torch.float32 and t.is_contiguous() for t in (u, v, g)) and u.dim() == 1:
            self._impl(g).momentum_correction(g, u, v, float(mu), bool(nesterov))
        else:
            torch_fallback.momentum_correction(g, u, v, float(mu), bool(nesterov))
        return u, v

    def accumulate(self, state, key, scale, add, post=1.0):
        buf = state[key]  # in place: one pass over the buffer instead of two temporaries
        if scale != 1.0:
            buf.mul_(scale)
        buf.add_(add)
        if post != 1.0:
            buf.mul_(post)
        return buf

    def write(self, state, key, value):
        old = state.get(key)
        if isinstance(old, torch.Tensor) and old.shape == value.shape and old.dtype == value.dtype:
            if old.data_ptr() != value.data_ptr():
                old.copy_(value)
        else:
            state[key] = value

    # --- shape and linear algebra -----------------------------------------------------------
    def reshape(self, x, shape): return x.reshape(tuple(shape))

    def matmul(self, a, b, transpose_a=False, transpose_b=False, out=None):
        a, b = (a.t() if transpose_a else a), (b.t() if transpose_b else b)
        if out is None or out.dtype != a.dtype or not out.is_contiguous():
            return self.into(out, a @ b)
        if out.numel() != a.shape[0] * b.shape[1]:
            raise ValueError(f"out has {out.numel()} elements; the product has {a.shape[0] * b.shape[1]}")
        torch.matmul(a, b, out=out.view(a.shape[0], b.shape[1]))
        return out

    def orthonormalize(self, m): return torch.linalg.qr(m, mode="reduced").Q

    # PowerSGD's products: the kernels (or the fallback's in-place torch) for 2-D float32 CPU
    # matrices; the small factors are made contiguous (QR's Q is column-major).
    def _lowrank_impl(self, big: Sequence[Any], small: Sequence[Any]) -> Any:
        ok = all(t.dtype == torch.float32 and t.dim() == 2 for t in (*big, *small)) and \
            all(t.is_contiguous() for t in big)
        return self._impl(big[0]) if ok else None

    def lowrank_project(self, e, g, q):
        q = q.contiguous()
        impl = self._lowrank_impl((e, g), (q,))
        return super().lowrank_project(e, g, q) if impl is None else impl.lowrank_project(e, g, q)

    def lowrank_project_back(self, m, p):
        p = p.contiguous()
        impl = self._lowrank_impl((m,), (p,))
        return super().lowrank_project_back(m, p) if impl is None else impl.lowrank_project_back(m, p)

    def lowrank_residual(self, m, p, q):
        p, q = p.contiguous(), q.contiguous()
        impl = self._lowrank_impl((m,), (p, q))
        return super().lowrank_residual(m, p, q) if impl is None else impl.lowrank_residual(m, p, q)

    def outer(self, a, b): return torch.outer(a, b).reshape(-1)

    def max_abs(self, x):
        impl = self._impl(x) if x.dtype == torch.float32 and x.is_contiguous() else torch_fallback
        return impl.max_abs(x)

    # --- kernels ------------------------------------------------------------------------------
    def sign_pack(self, x):
        _check_x(x)
        return self._impl(x).sign_pack(x)

    def ef_sign_pack(self, x, residual):
        _check_x(x)
        _check_x(residual, "residual")
        packed, scale = self._impl(x).ef_sign_pack(x, residual)
        return packed, scale, residual

    def twobit_pack(self, x, threshold, residual=None):
        _check_x(x)
        if residual is not None:
            _check_x(residual, "residual")
        return self._impl(x).twobit_pack(x, float(threshold), residual), residual

    def levels_pack(self, x, scale, levels, natural, key):
        _check_x(x)
        if not 1 <= levels <= 127:
            raise ValueError(f"levels_pack: levels={levels} is out of range; allowed: 1..127")
        return self._impl(x).levels_pack(x, float(scale), int(levels), bool(natural), int(key))

    def ternary_pack(self, x, scale, key):
        _check_x(x)
        return self._impl(x).ternary_pack(x, float(scale), int(key))

    def natural_pack(self, x, key):
        _check_x(x)
        return self._impl(x).natural_pack(x, int(key))

    def unpack_sum(self, packed, n, bits, tables, out=None):
        return self._impl(packed).unpack_sum(packed, int(n), int(bits), tables, _checked_out(out, n))

    def bf16_sum(self, bits, n, out=None):
        if bits.dtype != torch.int16:
            raise TypeError(f"bits must be an int16 tensor, got {dtype_name(bits.dtype)}")
        if n < 1 or bits.numel() == 0 or bits.numel() % n:
            raise ValueError(f"bf16_sum: bits has {bits.numel()} elements, not a positive multiple "
                             f"of n={n}")
        return self._impl(bits).bf16_sum(bits.contiguous(), int(n), _checked_out(out, n))

    def sign_vote(self, packed, n, scale, out=None):
        return self._impl(packed).sign_vote(packed, int(n), float(scale), _checked_out(out, n))

    def minmax_pack(self, x, chunk):
        _check_x(x)
        return self._impl(x).minmax_pack(x, int(chunk))

    def minmax_unpack_sum(self, codes, bounds, n, chunk, out=None):
        return self._impl(codes).minmax_unpack_sum(codes, bounds, int(n), int(chunk), _checked_out(out, n))

    def count_ge(self, x, threshold):
        _check_x(x)
        return int(self._impl(x).count_ge(x, float(threshold)))

    def select_ge(self, x, threshold):
        _check_x(x)
        return self._impl(x).select_ge(x, float(threshold))

    def sampled_threshold(self, x, start, stride, top):
        _check_x(x)
        return float(self._impl(x).sampled_threshold(x, int(start), int(stride), int(top)))

    def topk_abs(self, x, k):
        _check_x(x)
        if not 0 <= k <= x.numel():
            raise ValueError(f"topk_abs: k={k} is out of range; allowed: 0..{x.numel()} (the tensor's size)")
        return self._impl(x).topk_abs(x, int(k))

    def sparse_sum(self, n, indices, values, out=None):
        _check_x(values, "values")
        if indices.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"indices must be int32 or int64, got {dtype_name(indices.dtype)}")
        if indices.numel() != values.numel():
            raise ValueError(f"sparse_sum: {indices.numel()} indices for {values.numel()} values")
        return self._impl(values).scatter_add(int(n), indices.contiguous(), values, _checked_out(out, n))
