"""Threshold sparsification (Strom 2015; GRACE's ``threshold``): send every element with
``|g_i| ≥ τ`` as a (value, index) pair, allgathered.

No sort and no sample: one counting and one compaction pass. The number sent follows the
gradient's scale, from nothing to everything, so τ must match the gradients (and their decay
during training); pair it with error feedback (``ef="vanilla"``) so that small elements
accumulate until they cross τ. NaN elements are always sent.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from ..contract.compressor import Packet, TensorInfo, decode_into
from ..contract.validation import check_range
from ..ops.facade import Ops, Tensor
from .payload import as_float32, check_payload
from .sparse import SparseCompressor


class Threshold(SparseCompressor):
    """Send the elements whose magnitude is at least ``threshold``."""

    name = "threshold"

    def __init__(self, threshold: float = 0.01):
        self.threshold = check_range("Threshold", "threshold", threshold, 0.0, math.inf,
                                     low_open=True, high_open=True)

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        x32, dtype = as_float32(ops, x, info)
        values, indices = ops.select_ge(x32, self.threshold)
        packet = self.packet(ops, ops.cast(values, dtype), indices, info)
        packet.ctx = dtype
        return packet

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        if len(tensors) != 2:
            raise ValueError(f"threshold: expected 2 payload tensors (values, indices), got {len(tensors)}")
        values, indices = tensors
        check_payload(ops, self.name, "indices", indices, ops.dtype(indices), ops.numel(values))
        values = ops.cast(values, "float32")
        return decode_into(ops, out, ctx, lambda buf: ops.sparse_sum(info.numel, indices, values, out=buf))
