"""8-bit min-max quantisation per chunk (Bagua's ``MinMaxUInt8``).

Per chunk of ``chunk`` elements: ``code = rint((g − min) · 255 / (max − min))``, sent with the
chunk's min and max; decoded as ``min + code · (max − min) / 255``. Deterministic and biased by
at most half a step, ``(max − min)/510``, per element; small chunks track local ranges better
and cost 8 bytes of bounds each (``chunk=2048``: 0.4% overhead). 4x fewer bytes than float32,
allgathered. A chunk holding NaN or Inf decodes as NaN (so every rank sees it, as with a dense
allreduce).
"""
from __future__ import annotations

from typing import Any, Optional

from ..backend import Ops, Tensor
from ..compressor import Compressor, Packet, TensorInfo, decode_into
from ..validation import check_int
from .payload import as_float32, check_payload


class Int8(Compressor):
    """Bagua's min-max uint8 quantisation, per chunk of ``chunk`` elements."""

    name = "int8"
    supports_alltoall = True

    def __init__(self, chunk: int = 2048):
        self.chunk = check_int("Int8", "chunk", chunk, 1)

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        x32, dtype = as_float32(ops, x, info)
        codes, bounds = ops.minmax_pack(x32, self.chunk)
        return Packet([codes, bounds], dtype, summable=False)

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        return self.decompress_gathered(ops, tensors, ctx, info, 1, out)

    def decompress_gathered(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                            world: int, out: Optional[Tensor] = None) -> Tensor:
        if len(tensors) != 2:
            raise ValueError(f"int8: expected 2 payload tensors (codes, bounds), got {len(tensors)}")
        codes, bounds = tensors
        chunks = -(-info.numel // self.chunk)
        check_payload(ops, self.name, "codes", codes, "uint8", world * info.numel)
        check_payload(ops, self.name, "bounds", bounds, "float32", world * 2 * chunks)
        return decode_into(ops, out, ctx,
                           lambda buf: ops.minmax_unpack_sum(codes, bounds, info.numel, self.chunk, out=buf))
