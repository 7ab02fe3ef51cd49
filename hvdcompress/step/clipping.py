"""Local gradient clipping with compression (framework-agnostic part).

Clipping ``p.grad`` after the exchange clips the aggregated update. With a compressor that owns
the momentum (DGC, the Momentum decorator) or keeps a residual (error feedback), that update is
not the gradient: it is the momentum-corrected, residual-carrying result of compression, so
clipping it is a different algorithm. The DGC paper (Lin et al., ICLR 2018, sec. 3.3 and
Algorithm 1, "local gradient clipping") clips instead each rank's own contribution, before it is
added to the residual or the momentum, with the threshold scaled by N^-1/2. In the paper rank k
contributes G_k = g_k / N (g_k: its local mean gradient; the update is the sum of the G_k), and
G_k is clipped to c / sqrt(N):

    op=Average (p.grad is g_k, the update their mean):  g_k <- g_k · min(1, c·sqrt(N) / ||g_k||)
    op=Sum     (p.grad is G_k, the update their sum):   G_k <- G_k · min(1, c / (sqrt(N)·||G_k||))

(||.||: the L2 norm over all of the rank's tensors.) If the N contributions were independent with
equal norms, the norm of their sum would be sqrt(N) times one's, so each at c / sqrt(N) puts
the aggregated update near c, as the dense clip would. The trade-off: clipping needs the global
norm of all of a rank's gradients, so compression waits for the last gradient of the backward
pass instead of overlapping with it.

That rule is not Horovod's: ``clip_grad_norm_`` after ``synchronize()`` clips the averaged
gradient to c, and the local rule differs from it whenever the ranks' gradients are not
independent: correlated gradients, the usual case, are clipped later (N equal gradients only
past c·sqrt(N)), which costs convergence even without compression. So ``clip_grad_norm`` clips
locally only where it must, :func:`clips_before_exchange`: with a compressor that carries state
(owns the momentum or keeps a residual, at either level of two-level compression). With a
stateless one (none, fp16, bf16, int8, the quantisers without error feedback, random-k) the
exchanged gradient is the gradient, so it is clipped after the exchange to c, exactly as
Horovod's pattern does, and compression keeps overlapping with the backward pass. The Adam take-over (:mod:`hvdcompress.adam.frozen`) clips the
exchanged mean in its v-steps (int8, stateless: the mean is the gradient), as Horovod does, and
keeps the coefficient kappa; in its compressed steps each rank scales its gradient by kappa, then
clips it locally as above (:meth:`hvdcompress.step.driver.StepDriver.clips_before`): m then sees the
mean clipped as v did, and a spike is still cut at c·sqrt(N).

Evidence: benchmarks/README.md section 6 (Language model with SGD and clipping), "Why the defaults".
"""
from __future__ import annotations

import math
from typing import Optional

from ..contract.validation import is_real


def check_clip_grad_norm(value: Optional[float], compressor=None) -> Optional[float]:
    """Validate the ``clip_grad_norm`` argument of the framework wrappers.

    ``None`` (no clipping) or a finite number > 0. A compressor that clips on its own
    (``DGC(clip_norm=...)``) next to ``clip_grad_norm`` is an error: one of them must go.
    """
    if value is None:
        return None
    if not is_real(value) or not 0 < value < math.inf:
        raise ValueError(f"clip_grad_norm={value!r}: allowed: None or a finite number > 0")
    own = compressor.unwrap().clip_norm if compressor is not None else None
    if own is not None:
        raise ValueError(f"clip_grad_norm={value!r} and the compressor's clip_norm={own!r} both "
                         "clip; set one of them (clip_grad_norm clips all gradients together, "
                         "clip_norm each tensor on its own)")
    return float(value)


def state_carrier(compressor, intra_node=None):
    """The compressor that carries state (owns the momentum or keeps a residual):
    ``compressor``, else the two-level ``intra_node`` compressor, else None."""
    return next((c for c in (compressor, intra_node) if c is not None and c.carries_state), None)


def clips_before_exchange(compressor, intra_node=None) -> bool:
    """Whether ``clip_grad_norm`` clips each rank's gradients before compression (the DGC
    paper's local clip, :func:`local_clip_limit`): when ``compressor`` or the two-level
    ``intra_node`` compressor carries state. Otherwise the wrappers clip the exchanged (averaged
    or summed) gradients to ``clip_grad_norm`` itself, as Horovod's documented pattern does."""
    return state_carrier(compressor, intra_node) is not None


def what_it_keeps(compressor) -> str:
    """How a compressor that carries state makes the exchanged update differ from the gradient,
    for the warnings about clipping after the exchange."""
    return ("applies the momentum itself" if compressor.takes_over_momentum
            else "keeps an error-feedback residual")


def local_clip_limit(clip_grad_norm: float, world: int, average: bool = True) -> float:
    """The norm each of ``world`` ranks clips its local gradients to: c · sqrt(N) when the
    exchange averages them (its ``p.grad`` is the paper's N · G_k), c / sqrt(N) when it sums."""
    return clip_grad_norm * math.sqrt(world) if average else clip_grad_norm / math.sqrt(world)
