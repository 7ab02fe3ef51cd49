"""QSGD (Alistarh et al., NeurIPS 2017): dithering with ``levels`` uniform levels and the L2 norm.

``C(g)_i = ‖g‖₂ · sign(g_i) · ξ_i / s`` with ξ_i the stochastic rounding of ``s·|g_i|/‖g‖₂``.
Unbiased with variance at most ``min(n/s², √n/s)·‖g‖²``; more levels, less variance, same
1 byte per element here (2 bits for s = 1). See :mod:`~hvdcompress.compressors.dithering`.
"""
from __future__ import annotations

from .dithering import Dithering


class QSGD(Dithering):
    """Linear partition, L2 normalisation."""

    name = "qsgd"

    def __init__(self, levels: int = 64, seed: int = 0):
        super().__init__(levels=levels, partition="linear", norm="l2", seed=seed)
