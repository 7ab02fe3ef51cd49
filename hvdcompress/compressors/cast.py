"""Casting to a 16-bit float: ``C(g) = fp16(g)``, summed in 16 bits by allreduce.

Halves the bytes for float32 gradients with no state. The trade-off: fp16 has 10 mantissa bits
and a range of about 6e-8 to 65504, so tiny gradients underflow and a sum over many ranks can
overflow; bf16 keeps float32's range with only 7 mantissa bits. Mild: for fast links and the
intra-node level. A gradient already in the target dtype is sent as it is. Float32 gradients are
rounded to nearest even by ``Ops.half_cast`` (kernels.h ``half_cast``: one pass into a recycled
buffer on the CPU, the same bits on every path and framework, NaNs included).

Horovod's collectives have no bfloat16 type, so bf16 payloads travel as their int16 bits through
allgather and are decoded and summed in float32 in one pass (``Ops.bf16_sum``), then cast to the
gradient's dtype: for 2 ranks the bytes equal an fp16 allreduce's; beyond that they grow with
the number of ranks. fp16 payloads (allreduced in float16) are decoded the same way, by
``Ops.fp16_sum``: the exact float32 value of each half.
"""
from __future__ import annotations

from typing import Any, Optional

from ..contract.compressor import AdamNeeds, Compressor, Packet, TensorInfo, check_float_tensor, decode_into
from ..ops.facade import Ops, Tensor
from .payload import check_payload


class Cast(Compressor):
    """Cast to ``wire_dtype`` for the wire and back to the gradient's dtype."""

    name = "cast"
    wire_dtype = "float16"
    carrier: Optional[str] = None  # a same-width dtype Horovod can gather, when it cannot sum wire_dtype
    fixed_size_payload = True
    adam_needs = AdamNeeds(wide=True)
    keeps_precision = True

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        check_float_tensor(ops, x, info)
        wire = ops.half_cast(x, self.wire_dtype)
        if self.carrier is None:
            return Packet([wire], ops.dtype(x), summable=True)
        return Packet([ops.bitcast(wire, self.carrier)], ops.dtype(x), summable=False)

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        return ops.cast(tensors[0], ctx) if out is None else ops.into(out, tensors[0])  # one casting copy


class FP16(Cast):
    """IEEE half precision on the wire."""

    name = "fp16"
    wire_dtype = "float16"
    summable_payload = True

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        if ctx == self.wire_dtype:  # a float16 gradient, sent as it was
            return super().decompress(ops, tensors, ctx, info, out)
        return self._decode(ops, tensors, ctx, info, 1, out)

    def decompress_gathered(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                            world: int, out: Optional[Tensor] = None) -> Tensor:
        if ctx != "float32":  # summed in the gradient's dtype, as before
            return super().decompress_gathered(ops, tensors, ctx, info, world, out)
        return self._decode(ops, tensors, ctx, info, world, out)

    def _decode(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo, world: int,
                out: Optional[Tensor]) -> Tensor:
        """The float32 values of the halves, summed over ``world`` payloads in rank order (the
        bits of decoding them one by one and adding), in one pass (``Ops.fp16_sum``)."""
        if len(tensors) != 1:
            raise ValueError(f"fp16: expected 1 payload tensor (the values), got {len(tensors)}")
        check_payload(ops, self.name, "values", tensors[0], self.wire_dtype, world * info.numel)
        bits = ops.bitcast(tensors[0], "int16")
        if out is None:
            return decode_into(ops, None, ctx, lambda buf: ops.fp16_sum(bits, info.numel))
        if ops.dtype(out) == "float32":  # written directly
            return ops.fp16_sum(bits, info.numel, out=out)
        return ops.into(out, ops.fp16_sum(bits, info.numel))  # the float32 values in out's dtype, as before


class BF16(Cast):
    """bfloat16 on the wire: float32's exponent range, 8 bits of precision."""

    name = "bf16"
    supports_alltoall = True  # allgathered (Horovod sums no bf16), so alltoall pays at P >= 3
    wire_dtype = "bfloat16"
    carrier = "int16"

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        return self.decompress_gathered(ops, tensors, ctx, info, 1, out)

    def decompress_gathered(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                            world: int, out: Optional[Tensor] = None) -> Tensor:
        if len(tensors) != 1:
            raise ValueError(f"bf16: expected 1 payload tensor (the bits), got {len(tensors)}")
        check_payload(ops, self.name, "bits", tensors[0], self.carrier, world * info.numel)
        return decode_into(ops, out, ctx, lambda buf: ops.bf16_sum(tensors[0], info.numel, out=buf))
