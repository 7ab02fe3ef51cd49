"""A compressor-owned error-feedback residual, for compressors that update it inside their own
kernel (EF-signSGD, TwoBit, PowerSGD) instead of through the ErrorFeedback decorator."""
from __future__ import annotations

from ..contract.compressor import TensorInfo
from ..ops.facade import Ops, Tensor

RESIDUAL = "quant_residual"


class OwnResidual:
    """Mixin: the compressor keeps its own error-feedback residual (state ``quant_residual``),
    updated inside its kernel. Wrapping it in ErrorFeedback would count the error twice, so that
    is refused with a clear error."""

    keeps_residual = True

    def init_state(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> None:
        if RESIDUAL not in state:
            ops.write(state, RESIDUAL, ops.zeros(info.numel, like=x, dtype="float32"))

    def residual(self, state: dict) -> Tensor:
        if "residual" in state:
            raise ValueError(f"{type(self).__name__} keeps its own error-feedback residual; do not "
                             "wrap it in ErrorFeedback (use ef='none')")
        return state[RESIDUAL]
