"""Random dithering (Alistarh et al. 2017; Horváth et al. 2019): stochastic rounding of
``|g_i| / ‖g‖`` to ``levels`` levels.

    r_i = |g_i| / ‖g‖ (· levels for the linear partition)
    linear : levels 0, 1/s, ..., 1;   natural: levels 0, 2^(1-s), ..., 1/2, 1
    round r_i to a neighbouring level, up with probability (r_i − low) / (high − low)
    send sign(g_i) · level index (1 byte; 2 bits when s = 1) and ‖g‖ (4 bytes)

Unbiased: E[C(g)] = g, with variance growing as the levels get coarser. ``norm="max"``
(‖g‖∞) gives lower variance than ``"l2"`` (QSGD's choice, which has the better worst-case
bound). The natural partition spends its levels where small elements are, near 0 on a log scale.
4x (16x for s = 1) fewer bytes than float32, allgathered.

Random numbers come from ``seed``, the step and the tensor's name, so a run is reproducible;
every rank draws the same stream (the ranks' rounding errors are then correlated for identical
gradients, which matters little for the distinct gradients of data parallelism).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from ..contract.compressor import TensorInfo
from ..contract.keys import next_rank_key
from ..contract.validation import check_choice, check_int
from ..ops.facade import Ops, Tensor
from .quant import TableQuantizer


def level_table(levels: int, natural: bool) -> np.ndarray:
    """float32[256]: the value (for a norm of 1) of each levels_pack code byte."""
    signed = np.arange(256, dtype=np.int64)
    signed = np.where(signed > 127, signed - 256, signed)
    magnitude = np.minimum(np.abs(signed), levels)
    if natural:
        values = np.where(magnitude > 0, np.ldexp(1.0, magnitude - levels), 0.0)
    else:
        values = magnitude / levels
    table = (np.sign(signed) * values).astype(np.float32)
    table[128] = np.nan  # code 0x80 marks a NaN element
    return table


class Dithering(TableQuantizer):
    """``levels`` levels per sign, ``partition`` 'linear' or 'natural', ``norm`` 'max' or 'l2'."""

    name = "dithering"

    def __init__(self, levels: int = 8, partition: str = "natural", norm: str = "max", seed: int = 0):
        own = type(self).__name__
        self.levels = check_int(own, "levels", levels, 1, 127)
        self.partition = check_choice(own, "partition", partition, ("linear", "natural"))
        self.norm = check_choice(own, "norm", norm, ("max", "l2"))
        self.seed = check_int(own, "seed", seed, 0)

    @property
    def bits(self) -> int:  # type: ignore[override]
        return 2 if self.levels == 1 else 8

    def unit_table(self) -> np.ndarray:
        if self.levels == 1:
            return np.array([0.0, np.nan, -1.0, 1.0], dtype=np.float32)
        return level_table(self.levels, self.partition == "natural")

    def encode(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Tuple[Tensor, Tensor]:
        key = next_rank_key(self.seed, state, info.name, info.rank)
        norm = ops.reshape(ops.max_abs(x) if self.norm == "max" else ops.norm(x), (1,))
        natural = self.partition == "natural"
        zero = ops.zeros(1, like=norm)
        top = zero + (1.0 if natural else float(self.levels))  # a tensor: top / norm is IEEE division
        inv = ops.where(ops.isfinite(norm) & (norm > 0), top / norm, zero)  # on the device: no host read
        if self.levels == 1:
            codes = ops.ternary_pack(x, inv, key)
        else:
            codes = ops.levels_pack(x, inv, self.levels, natural, key)
        return codes, norm
