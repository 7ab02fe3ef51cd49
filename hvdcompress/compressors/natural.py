"""Natural compression (Horváth et al., 2019): stochastic rounding to a power of two.

``|g_i| ∈ [2^E, 2^(E+1))`` becomes ``2^(E+1)`` with probability ``|g_i|/2^E − 1``, else ``2^E``:
unbiased, relative variance at most 1/8, no norm to compute. Sent as one byte per element (sign
and a 7-bit exponent covering 2^-100 .. 2^25; smaller results flush to 0, larger ones are
infinite), 4x fewer bytes than float32, allgathered.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from ..contract.compressor import TensorInfo
from ..contract.keys import next_rank_key
from ..contract.validation import check_int
from ..ops.facade import Ops, Tensor
from .payload import constant
from .quant import TableQuantizer


def natural_table() -> np.ndarray:
    """float32[256]: the value of each natural_pack code byte."""
    c = np.arange(128)
    magnitude = np.where(c == 0, 0.0, np.ldexp(1.0, c - 101))
    magnitude[127] = np.inf
    table = np.concatenate([magnitude, -magnitude]).astype(np.float32)
    table[128] = np.nan  # 0x80 marks a NaN element
    return table


class Natural(TableQuantizer):
    """Powers of two, unbiased."""

    name = "natural"

    def __init__(self, seed: int = 0):
        self.seed = check_int("Natural", "seed", seed, 0)

    def unit_table(self) -> np.ndarray:
        return natural_table()

    def encode(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Tuple[Tensor, Tensor]:
        return ops.natural_pack(x, next_rank_key(self.seed, state, info.name, info.rank)), constant(ops, 1.0, x)
