"""The core's :class:`~hvdcompress.ops.Ops` on PyTorch tensors (any device)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ..backend import Ops

_DTYPES = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
    "float64": torch.float64, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def dtype_name(dt: torch.dtype) -> str:
    return _NAMES.get(dt, str(dt).replace("torch.", ""))


class TorchOps(Ops):
    name = "torch"

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
        return x.index_fill_(0, indices.long(), value)

    def concat(self, xs: Sequence[Any]): return torch.cat(list(xs))

    def split(self, x, sizes): return list(torch.split(x, list(sizes)))

    def write(self, state, key, value):
        old = state.get(key)
        if isinstance(old, torch.Tensor) and old.shape == value.shape and old.dtype == value.dtype:
            if old.data_ptr() != value.data_ptr():
                old.copy_(value)
        else:
            state[key] = value
