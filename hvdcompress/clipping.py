"""Local gradient clipping with compression (framework-agnostic part).

Clipping ``p.grad`` after the exchange clips the aggregated update. With a compressor that owns
the momentum (DGC, the Momentum decorator) or keeps a residual (error feedback), that update is
not the gradient: it is the momentum-corrected, residual-carrying result of compression, so
clipping it is a different algorithm. The DGC paper (Lin et al., ICLR 2018, sec. 3.3, "local
gradient clipping") clips instead each rank's own gradient, before it is added to the residual
or the momentum, with the threshold scaled by N^-1/2:

    g_r <- g_r * min(1, c / (sqrt(N) * ||g_r||))        ||.||: L2 norm over all tensors

If the N ranks' gradients were independent (orthogonal) with equal norms, the norm of their sum
would be sqrt(N) times one rank's, so clipping each to c / sqrt(N) clips the sum (the aggregated
gradient the paper reasons about) to about c. The trade-off:
clipping needs the global norm of all of a rank's gradients, so compression waits for the last
gradient of the backward pass instead of overlapping with it.
"""
from __future__ import annotations

import math
from typing import Optional


def check_clip_grad_norm(value: Optional[float], compressor=None) -> Optional[float]:
    """Validate the ``clip_grad_norm`` argument of the framework wrappers.

    ``None`` (no clipping) or a finite number > 0. A compressor that clips on its own
    (``DGC(clip_norm=...)``) next to ``clip_grad_norm`` is an error: one of them must go.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"clip_grad_norm={value!r}: allowed: None or a finite number > 0")
    own = getattr(compressor.unwrap(), "clip_norm", None) if compressor is not None else None
    if own is not None:
        raise ValueError(f"clip_grad_norm={value!r} and the compressor's clip_norm={own!r} both "
                         "clip; set one of them (clip_grad_norm clips all gradients together, "
                         "clip_norm each tensor on its own)")
    return float(value)


def local_clip_limit(clip_grad_norm: float, world: int) -> float:
    """The norm each of ``world`` ranks clips its local gradients to: c / sqrt(N)."""
    return clip_grad_norm / math.sqrt(world)
