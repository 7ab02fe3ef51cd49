"""TernGrad (Wen et al., NeurIPS 2017): stochastic ternarisation with the max norm.

``C(g)_i = ‖g‖∞ · sign(g_i) · b_i`` with ``b_i ~ Bernoulli(|g_i| / ‖g‖∞)``: unbiased, values in
{−s, 0, +s}, 2 bits per element plus 4 bytes (16x fewer bytes than float32). The variance is
large when a few elements dominate the max; the paper's layer-wise scaling is the per-tensor
norm here, and its gradient clipping is left to the user (torch.nn.utils.clip_grad_norm_).
"""
from __future__ import annotations

from .dithering import Dithering


class TernGrad(Dithering):
    """One level per sign, max normalisation."""

    name = "terngrad"

    def __init__(self, seed: int = 0):
        super().__init__(levels=1, partition="linear", norm="max", seed=seed)
