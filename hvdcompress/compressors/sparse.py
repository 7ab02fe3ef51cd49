"""The sparse payload shared by the sparsifiers (top-k, DGC, threshold): ``[values, indices]``.

Indices are int32 when the tensor has fewer than 2**31 elements, so an element costs
4 + 4 bytes on the wire (float32 values). Payloads of different ranks may differ in length;
allgather concatenates them and one scatter-add of the concatenation yields the sum over ranks,
so :meth:`decompress_gathered` needs no per-rank split.
"""
from __future__ import annotations

from typing import Any, Optional

from ..contract.compressor import Compressor, Packet, TensorInfo, decode_into
from ..ops.facade import Ops, Tensor

INT32_LIMIT = 2 ** 31


def index_dtype(numel: int) -> str:
    return "int32" if numel < INT32_LIMIT else "int64"


class SparseCompressor(Compressor):
    """Base for compressors whose payload is (values, indices) into the flat tensor."""

    def packet(self, ops: Ops, values: Tensor, indices: Tensor, info: TensorInfo) -> Packet:
        return Packet([values, ops.cast(indices, index_dtype(info.numel))], None, summable=False)

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        values, indices = tensors
        if ops.dtype(values) == "float32":  # the kernel: bounds-checked, no index cast
            return decode_into(ops, out, "float32", lambda buf: ops.sparse_sum(info.numel, indices, values, out=buf))
        return ops.sparse_sum(info.numel, indices, values, out=out)

    def decompress_gathered(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                            world: int, out: Optional[Tensor] = None) -> Tensor:
        return self.decompress(ops, tensors, ctx, info, out)
