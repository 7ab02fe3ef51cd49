"""Signum with majority vote (Bernstein et al., ICLR 2019).

Each rank sends the signs of its (momentum) gradient, 1 bit per element; the aggregate is the
elementwise majority ``sign(Σ_r sign(g_r))`` (0 on a tie), returned as ``world · vote`` so that
the wrapper's averaging gives the vote itself. Robust to a minority of bad ranks and as cheap
as signSGD, but the step is ±lr per element: use a small learning rate (about 1e-4) and
momentum before the sign, i.e. ``{"compressor": "signum", "momentum": "plain"}`` (the Momentum
decorator, which takes the optimizer's momentum over). Plain signs are sent (no scale).
"""
from __future__ import annotations

from typing import Any, Optional

from ..contract.compressor import TensorInfo, decode_into
from ..ops.facade import Ops, Tensor
from .onebit import OneBit


class Signum(OneBit):
    """Unscaled signs, aggregated by majority vote."""

    name = "signum"
    supports_alltoall = False  # a majority vote, not a sum: nothing to re-compress and add
    fixed_size_payload = False

    def __init__(self):
        super().__init__(scale=False)

    def decompress_gathered(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                            world: int, out: Optional[Tensor] = None) -> Tensor:
        codes, _ = self.checked(ops, tensors, info, world)
        return decode_into(ops, out, ctx, lambda buf: ops.sign_vote(codes, info.numel, float(world), out=buf))
