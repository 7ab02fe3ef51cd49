"""1-bit sign compression: signSGD (Bernstein et al. 2018), optionally scaled (Seide et al. 2014).

``C(g) = s · sign(g)`` with ``s = mean|g|`` (``scale=True``) or ``s = 1``: one bit per element
plus 4 bytes, 32x fewer bytes than float32, allgathered. Biased: the magnitude of every element
is replaced by the mean, so pair it with error feedback (:class:`EFSignSGD` or ``ef="vanilla"``)
for SGD-like convergence; unscaled signs need a learning rate tuned for them (about 1e-4).
Zeros are sent as +s (-0.0 as -s).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from ..backend import Ops, Tensor
from ..compressor import TensorInfo
from .payload import constant
from .quant import TableQuantizer


class OneBit(TableQuantizer):
    """Signs, scaled by mean |g| when ``scale`` is true."""

    name = "onebit"
    bits = 1

    def __init__(self, scale: bool = True):
        self.scale = bool(scale)

    def unit_table(self) -> np.ndarray:
        return np.array([-1.0, 1.0], dtype=np.float32)

    def encode(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Tuple[Tensor, Tensor]:
        packed, mean = ops.sign_pack(x)
        return packed, mean if self.scale else constant(ops, 1.0, x)
