"""Random-k sparsification with a shared seed (Stich et al. 2018; GRACE's randomk).

Every rank draws the same k indices (without replacement, ascending) from the key
``step_key(seed, step, name)``: the k smallest of ``uniform24(i, key)·2³² + i``, kernels.h's
counter-based hash (:meth:`hvdcompress.backend.Ops.shared_indices`), computed on the tensor's
device (torch) or with numpy (TensorFlow), bit-identical, with no host read. So only the k values
travel and they can be summed by allreduce: 4k bytes per rank, with no index bytes and no allgather growth with the number of
ranks. Unbiased only with ``scale=True`` (values multiplied by n/k, which raises the variance by
the same factor); without it, pair it with error feedback. Cheaper than top-k (no sort) but it
drops large and small elements alike, so it converges more slowly at the same k.
"""
from __future__ import annotations

from typing import Any, Optional, Union

from ..compressor import Packet, TensorInfo, check_float_tensor
from ..backend import Ops, Tensor
from ..validation import check_int
from ..keys import advance_step, step_key
from .density import check_k, resolve_k
from .sparse import SparseCompressor


class RandomK(SparseCompressor):
    """Send ``k`` elements at indices drawn from a seed shared by all ranks."""

    name = "randomk"

    def __init__(self, k: Union[int, float] = 0.01, seed: int = 0, scale: bool = False):
        self.k = check_k("RandomK", k)
        self.seed = check_int("RandomK", "seed", seed, 0)
        self.scale = bool(scale)

    def init_state(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> None:
        state.setdefault("step", 0)

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        check_float_tensor(ops, x, info)
        step = advance_step(state)
        k = resolve_k(self.k, info.numel)
        indices = ops.shared_indices(info.numel, k, step_key(self.seed, step, info.name), like=x)
        values = ops.gather(x, indices)
        if self.scale:
            values = values * (info.numel / k)
        return Packet([values], indices, summable=True)

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        return super().decompress(ops, [tensors[0], ctx], None, info, out)
