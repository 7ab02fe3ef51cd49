"""No compression: the dense gradient, allreduced. The baseline every other compressor is
measured against (4 bytes per float32 element on the wire)."""
from __future__ import annotations

from typing import Any, Optional

from ..contract.compressor import AdamNeeds, Compressor, Packet, TensorInfo
from ..ops.facade import Ops, Tensor


class NoCompression(Compressor):
    """Identity: ``C(g) = g``, summable."""

    name = "none"
    fixed_size_payload = True
    summable_payload = True
    adam_needs = AdamNeeds(wide=True)
    keeps_precision = True

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        return Packet([x], None, summable=True)

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        return ops.into(out, tensors[0])
