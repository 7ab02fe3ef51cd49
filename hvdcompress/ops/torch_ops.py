"""The core's :class:`~hvdcompress.ops.facade.Ops` on PyTorch tensors (any device).

The kernel operations run on an implementation table chosen per device type: the C++ kernels
(:mod:`hvdcompress.ops.native`, shared with TensorFlow) for CPU tensors when they are built, the Triton kernels
:mod:`hvdcompress.ops.triton_kernels` for CUDA tensors when ``triton`` is importable, and the
plain-torch fallback :mod:`hvdcompress.ops.torch_fallback` otherwise (other devices, neither
available, or ``HVDCOMPRESS_DISABLE_KERNELS=1``). Which path is in use is logged once, on the
``hvdcompress`` logger.
"""
from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import Any, Dict, Optional, Sequence, Union

import numpy as np
import torch

from . import native, torch_fallback
from .checksum import host_checksum
from .facade import Ops

log = logging.getLogger("hvdcompress")
_LOADED: dict = {}

_DTYPES = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
    "float64": torch.float64, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}
_SIGNED = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # by element size


def device_checksum(x: torch.Tensor) -> torch.Tensor:
    """:mod:`hvdcompress.step.replicas`'s device checksum, sum_i b_i * (2i + 1) mod 2^64, as a 0-d
    int64 tensor on ``x``'s device (int64 arithmetic wraps)."""
    flat = x.detach().reshape(-1)
    bits = flat.view(_SIGNED[flat.element_size()]).to(torch.int64)
    return torch.sum(bits * torch.arange(1, 2 * flat.numel() + 1, 2, dtype=torch.int64, device=flat.device))


def dtype_name(dt: torch.dtype) -> str:
    return _NAMES.get(dt, str(dt).replace("torch.", ""))


def load_kernels() -> Optional[native.Bridge]:
    """The C++ kernels on CPU tensors (:class:`hvdcompress.ops.native.Bridge` over zero-copy
    numpy views), or None when the kernel library is not built or HVDCOMPRESS_DISABLE_KERNELS=1.
    Logs the outcome once per process."""
    if "module" not in _LOADED:
        module, reason = None, "HVDCOMPRESS_DISABLE_KERNELS=1"
        if os.environ.get("HVDCOMPRESS_DISABLE_KERNELS", "0") != "1":
            try:
                module = native.Bridge(lambda a: isinstance(a, torch.Tensor),
                                       lambda t: t.detach().numpy(), torch.from_numpy)
            except ImportError as exc:
                reason = f"the C++ kernel library is not built ({exc})"
        if module is not None:
            log.info("using the C++ kernels (%s)", native.library_path())
        else:
            log.warning("%s; using the pure-torch fallback kernels", reason)
        _LOADED["module"] = module
    return _LOADED["module"]


def load_triton() -> Optional[ModuleType]:
    """The Triton kernels, or None when triton is not importable or HVDCOMPRESS_DISABLE_KERNELS=1.
    Logs the outcome once per process."""
    if "triton" not in _LOADED:
        module, reason = None, "HVDCOMPRESS_DISABLE_KERNELS=1"
        if os.environ.get("HVDCOMPRESS_DISABLE_KERNELS", "0") != "1":
            try:
                from . import triton_kernels as module
            except ImportError as exc:
                reason = f"triton is not importable ({exc}; pip install hvdcompress[gpu])"
        if module is not None:
            log.info("using the Triton kernels (triton %s%s)", module.triton.__version__,
                     ", interpreted" if module.INTERPRETED else "")
        else:
            log.warning("%s; CUDA tensors use the pure-torch fallback kernels", reason)
        _LOADED["triton"] = module
    return _LOADED["triton"]


def implementation_tables(kernels: Union[bool, str, None]) -> Dict[str, ModuleType]:
    """The kernel implementation per device type (``torch.device.type``); devices not listed use
    the plain-torch fallback. See :class:`TorchOps` for ``kernels``."""
    if kernels == "triton":
        module = load_triton()
        if module is None:
            raise ImportError("TorchOps(kernels='triton'): the Triton kernels are not available; "
                              "install triton (pip install hvdcompress[gpu]) and unset "
                              "HVDCOMPRESS_DISABLE_KERNELS")
        return {"cpu": module, "cuda": module}
    if kernels not in (None, True, False):
        raise ValueError(f"TorchOps: kernels={kernels!r}; allowed: None, True, False, 'triton'")
    if kernels is False:
        return {}
    cpu = load_kernels()
    if kernels and cpu is None:
        raise ImportError("TorchOps(kernels=True): the C++ kernels are not available; build "
                          "them with `pip install --no-build-isolation -e .` and unset "
                          "HVDCOMPRESS_DISABLE_KERNELS")
    cuda = load_triton() if torch.cuda.is_available() else None
    return {device: module for device, module in (("cpu", cpu), ("cuda", cuda)) if module is not None}


class TorchOps(Ops):
    """``kernels`` selects the implementation table (:func:`implementation_tables`):

    * None: the C++ kernels for CPU tensors when built (see :func:`load_kernels`), the Triton
      kernels for CUDA tensors when triton is importable (see :func:`load_triton`);
    * True: the same, but the C++ kernels are required (ImportError otherwise);
    * False: the plain-torch fallback on every device;
    * "triton": the Triton kernels on every device (ImportError without triton). CPU tensors run
      them under Triton's interpreter, which needs ``TRITON_INTERPRET=1`` set before triton is
      imported and while the kernels run: the tests' way to check them without a GPU."""

    name = "torch"
    in_place = True

    def __init__(self, kernels: Union[bool, str, None] = None):
        self._tables = implementation_tables(kernels)

    @property
    def uses_kernels(self) -> bool:
        """Whether the C++ kernels serve CPU tensors."""
        cpu = self._tables.get("cpu")
        return cpu is not None and cpu is _LOADED.get("module")

    def _impl(self, x: torch.Tensor) -> Any:
        return self._tables.get(x.device.type, torch_fallback)

    def scale_(self, x, s): return x.mul_(s)
    def numel(self, x): return x.numel()
    def ndim(self, x): return x.dim()
    def contiguous(self, x): return x.contiguous()
    def is_contiguous(self, x): return x.is_contiguous()
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

    def to_numpy(self, x): return x.detach().cpu().numpy()

    def checksums(self, xs):
        if xs[0].device.type == "cpu":  # the bits as integers: numpy has no bfloat16
            return torch.tensor([host_checksum(x.detach().view(_SIGNED[x.element_size()]).numpy())
                                 for x in xs], dtype=torch.int64)
        return torch.stack([device_checksum(x) for x in xs])

    def shared_indices(self, n, k, key, like):
        self._check_range("shared_indices: k", k, 0, n)
        return torch_fallback.shared_indices(n, k, key, like.device)  # on the device

    def magnitude(self, x):
        return x.abs().nan_to_num_(nan=float("inf"))

    def where(self, cond, a, b): return torch.where(cond, a, b)
    def isfinite(self, x): return torch.isfinite(x)

    def sqrt(self, x): return torch.sqrt(x)

    def gather(self, x, indices): return x[indices]

    def _scatter_add(self, n, indices, values):
        out = torch.zeros(n, dtype=values.dtype, device=values.device)
        return out.index_add_(0, indices, values)

    def fill_at(self, x, indices, value, non_finite_only=False, owned=False):
        indices = indices.long()
        if self._is_flat_float32(x):
            return self._impl(x).fill_at(x, indices.contiguous(), float(value), out=x,
                                         non_finite_only=non_finite_only)
        if non_finite_only:
            sent = x[indices]
            return x.index_copy_(0, indices, torch.where(torch.isfinite(sent), sent, value))
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

    def outer(self, a, b): return torch.outer(a, b).reshape(-1)
