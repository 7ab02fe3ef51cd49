"""2-bit threshold quantisation with residual (MXNet's ``2bit`` gradient compression).

    v = g + e;   q_i = +t if v_i ≥ t,  −t if v_i ≤ −t,  0 otherwise;   e ← v − q

Codes are packed 4 per byte, first element in the top bits: 11 = +t, 10 = −t, 00 = 0 (01 marks
a NaN, so it reaches every rank as with a dense allreduce). 16x fewer bytes than float32. Only
elements whose accumulated value crosses the threshold move, by exactly t, so t must be about
the size of typical gradient elements (MXNet's default 0.5 suits its loss scales; smaller
models want smaller t). ``residual=True`` keeps MXNet's residual inside the fused kernel (do not
add ErrorFeedback); ``residual=False`` is the stateless quantiser, e.g. for ErrorFeedback(...).
"""
from __future__ import annotations

import math
from typing import Tuple

import numpy as np

from ..contract.compressor import TensorInfo
from ..contract.validation import check_bool, check_range
from ..ops.facade import Ops, Tensor
from .payload import constant
from .quant import TableQuantizer
from .residual import RESIDUAL, OwnResidual


class TwoBit(OwnResidual, TableQuantizer):
    """MXNet 2-bit quantisation at ``threshold``."""

    name = "twobit"
    bits = 2

    def __init__(self, threshold: float = 0.5, residual: bool = True):
        self.threshold = check_range("TwoBit", "threshold", threshold, 0.0, math.inf,
                                     low_open=True, high_open=True)
        self.residual_inside = check_bool("TwoBit", "residual", residual)

    @property
    def keeps_residual(self) -> bool:  # type: ignore[override]
        return self.residual_inside

    def init_state(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> None:
        if self.residual_inside:
            super().init_state(ops, x, state, info)

    def arguments(self) -> dict:
        return {"threshold": self.threshold, "residual": self.residual_inside}

    def unit_table(self) -> np.ndarray:
        return np.array([0.0, np.nan, -1.0, 1.0], dtype=np.float32)

    def encode(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Tuple[Tensor, Tensor]:
        residual = self.residual(state) if self.residual_inside else None
        packed, residual = ops.twobit_pack(x, self.threshold, residual)
        if residual is not None:
            ops.write(state, RESIDUAL, residual)
        return packed, constant(ops, self.threshold, x)
