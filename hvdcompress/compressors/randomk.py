"""Random-k sparsification with a shared seed (Stich et al. 2018; GRACE's randomk).

Every rank draws the same k indices (distinct, ascending) from the key
``step_key(seed, step, name)``, stratified: [0, n) is cut into k strata
[floor(j·n/k), floor((j+1)·n/k)) and stratum j contributes the element at offset
``(uniform24(j, key) · size_j) >> 24``, kernels.h's counter-based hash
(:meth:`hvdcompress.ops.facade.Ops.shared_indices`), O(k) work, computed on the tensor's device
(torch) or with numpy (TensorFlow), bit-identical, with no host read. So only the k values travel
and they can be summed by allreduce: 4k bytes per rank, with no index bytes and no allgather
growth with the number of ranks. Unbiased only with ``scale=True``: each value is multiplied by
its stratum's size (≈ n/k; element i is drawn with probability 1/size), which raises the
variance by about that factor; without it, pair it with error feedback. Stratifying spreads the
k picks evenly over the tensor (no two from one stratum), which against an unstratified draw
lowers the variance for gradients whose magnitude varies smoothly along the tensor. Far cheaper
than top-k (no select) but it drops large and small elements alike, so it converges more slowly
at the same k.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np

from ..contract.compressor import AdamNeeds, Packet, TensorInfo, check_float_tensor
from ..contract.keys import advance_step, step_key
from ..contract.validation import check_bool, check_int
from ..ops.facade import Ops, Tensor
from .density import check_k, resolve_k
from .sparse import SparseCompressor


def stratum_sizes(n: int, k: int) -> np.ndarray:
    """The sizes of the k strata of [0, n) that :meth:`Ops.shared_indices` draws from (float32)."""
    edges = np.arange(k + 1, dtype=np.int64) * n // k
    return np.diff(edges).astype(np.float32)


class RandomK(SparseCompressor):
    """Send ``k`` elements at indices drawn from a seed shared by all ranks."""

    name = "randomk"
    fixed_size_payload = True
    adam_needs = AdamNeeds(delivers_late=True)

    def __init__(self, k: Union[int, float] = 0.01, seed: int = 0, scale: bool = False):
        self.k = check_k("RandomK", k)
        self.seed = check_int("RandomK", "seed", seed, 0)
        self.scale = check_bool("RandomK", "scale", scale)

    def init_state(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> None:
        state.setdefault("step", 0)

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        check_float_tensor(ops, x, info)
        step = advance_step(state)
        k = resolve_k(self.k, info.numel)
        indices = ops.shared_indices(info.numel, k, step_key(self.seed, step, info.name), like=x)
        values = ops.gather(x, indices)
        if self.scale:
            values = values * ops.cast(ops.from_numpy(stratum_sizes(info.numel, k), like=x),
                                       ops.dtype(x))
        return Packet([values], indices, summable=True)

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        return super().decompress(ops, [tensors[0], ctx], None, info, out)
