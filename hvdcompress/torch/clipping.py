"""Local gradient clipping for the torch optimizer (see :mod:`hvdcompress.step.clipping`)."""
from __future__ import annotations

import warnings
from typing import Callable, Iterable, Mapping, Optional, Sequence

import torch

from ..step.clipping import local_clip_limit, state_carrier, what_it_keeps


def clip_gradients(grads: Sequence[torch.Tensor], limit: float, scale: float = 1.0,
                   norm_of: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> Optional[torch.Tensor]:
    """Scale ``grads`` in place by ``scale``, then so that their global L2 norm is at most ``limit``;
    the coefficient applied (a device scalar; None without gradients).

    Same formula as ``torch.nn.utils.clip_grad_norm_`` (coefficient ``limit / (norm + 1e-6)``
    clamped to 1), computed on the device without reading the norm on the host; sparse
    gradients count with their (coalesced) values. ``norm_of(local)``: the norm of a model
    whose gradients other ranks hold parts of, from this rank's part's norm (sharded training).
    """
    if not grads:
        return None
    norms = [torch.linalg.vector_norm(g.coalesce().values() if g.is_sparse else g, dtype=torch.float32)
             for g in grads]
    total = torch.linalg.vector_norm(torch.stack(norms))
    if norm_of is not None:
        total = norm_of(total)
    coef = torch.clamp(limit / (total * scale + 1e-6), max=1.0) * scale
    for g in grads:
        g.mul_(coef.to(g.dtype))
    return coef


def clip_local_gradients(grads: Sequence[torch.Tensor], clip_grad_norm: float, world: int,
                         average: bool = True, scale: float = 1.0,
                         norm_of: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> None:
    """:func:`clip_gradients` to :func:`~hvdcompress.step.clipping.local_clip_limit` (c·sqrt(N) for
    op=Average, c/sqrt(N) for Sum), after ``scale`` (the driver's ``clip_scale()``): a rank's own
    gradients, before compression."""
    clip_gradients(grads, local_clip_limit(clip_grad_norm, world, average), scale, norm_of)


class GradientWatch:
    """Warns once when gradients are changed between ``synchronize()`` and ``step()`` (Horovod's
    clipping pattern) while the compressor, or the two-level ``intra_node`` one, owns the
    momentum or keeps a residual (:func:`~hvdcompress.step.clipping.state_carrier`): ``p.grad`` is
    then the exchanged update, not the gradient, so the change is a different algorithm from
    the one the user meant. It sees the change through the gradient's version counter."""

    def __init__(self, compressor, intra_node=None):
        self.carrier = state_carrier(compressor, intra_node)
        self.versions: dict = {}   # p -> p.grad._version when synchronize() wrote it
        self.warned = False

    def record(self, params: Iterable[torch.Tensor]) -> None:
        """After ``synchronize()`` wrote the gradients."""
        self.versions = {p: p.grad._version for p in params
                         if p.grad is not None and not p.grad.is_sparse}

    def check(self, names: Mapping[torch.Tensor, str]) -> None:
        """At ``step()`` after ``skip_synchronize()``."""
        if self.warned or self.carrier is None:
            return
        changed = [names[p] for p, v in self.versions.items()
                   if p.grad is not None and not p.grad.is_sparse and p.grad._version != v]
        if changed:
            self.warned = True
            warnings.warn(
                f"gradients of {len(changed)} parameter(s) (e.g. '{changed[0]}') were modified "
                f"between optimizer.synchronize() and optimizer.step(); with "
                f"{self.carrier.name}, which {what_it_keeps(self.carrier)}, p.grad there is the "
                "exchanged update, not the gradient, so clipping it is a different algorithm. To "
                "clip gradients, pass clip_grad_norm=... to hvdcompress.torch.DistributedOptimizer "
                "(it clips each rank's local gradients before compression).", stacklevel=4)
