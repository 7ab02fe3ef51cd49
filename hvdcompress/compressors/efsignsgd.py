"""EF-signSGD (Karimireddy et al., ICML 2019): scaled signs with error feedback, fused.

    p = g + e;   s = ‖p‖₁ / n;   send s · sign(p);   e ← p − s · sign(p)

Same wire format as :class:`~hvdcompress.compressors.onebit.OneBit` (1 bit per element + 4 bytes)
but nothing is lost over time, which fixes signSGD's convergence. The residual is updated inside
the packing kernel (two passes over the gradient instead of the four of ErrorFeedback(OneBit)),
so it must not be wrapped in ErrorFeedback again. Costs one float32 buffer per tensor.
"""
from __future__ import annotations

from typing import Tuple

from ..contract.compressor import TensorInfo
from ..ops.facade import Ops, Tensor
from .onebit import OneBit
from .residual import RESIDUAL, OwnResidual


class EFSignSGD(OwnResidual, OneBit):
    """Scaled signs of ``g + e`` with the residual ``e`` kept in the compressor."""

    name = "efsignsgd"

    def __init__(self):
        super().__init__(scale=True)

    def encode(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Tuple[Tensor, Tensor]:
        packed, scale, residual = ops.ef_sign_pack(x, self.residual(state))
        ops.write(state, RESIDUAL, residual)
        return packed, scale
