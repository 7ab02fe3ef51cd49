"""Top-k sparsification (Aji & Heafield 2017; Stich et al. 2018).

``C(g) = g ⊙ 1[|g_i| among the k largest]``, sent as k (value, index) pairs and allgathered:
a rank sends 8k bytes (float32 values, int32 indices) instead of 4n. Biased; use it with error
feedback (``ef="vanilla"``) so that what is not sent is sent later. The exact selection costs a
partial sort per step; DGC's sampled threshold is the cheaper approximation.

``k`` is a fraction of the tensor when it is a float in (0, 1], an element count when it is an
int >= 1; a count larger than the tensor sends the whole tensor. NaN and Inf elements count as
the largest, so they are always sent; among equal magnitudes the lower index wins, on every path
(kernels.h ``topk_abs``: a radix select on the magnitude's bits, O(n), no sort).
"""
from __future__ import annotations

from typing import Union

from ..contract.compressor import AdamNeeds, Packet, TensorInfo, check_float_tensor
from ..ops.facade import Ops, Tensor
from .density import check_k, resolve_k
from .sparse import SparseCompressor


class TopK(SparseCompressor):
    """Send the ``k`` largest-magnitude elements."""

    name = "topk"
    fixed_size_payload = True
    adam_needs = AdamNeeds(selects_by_magnitude=True, delivers_late=True, long_warmup_ranks=1)

    def __init__(self, k: Union[int, float] = 0.01):
        self.k = check_k("TopK", k)

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        check_float_tensor(ops, x, info)
        k = resolve_k(self.k, info.numel)
        if ops.dtype(x) == "float32":
            values, indices = ops.topk_abs(x, k)
        else:  # selected on the float32 magnitudes (exact for half types), x's own values sent
            indices = ops.topk_abs(ops.cast(x, "float32"), k)[1]
            values = ops.gather(x, indices)
        return self.packet(ops, values, indices, info)
