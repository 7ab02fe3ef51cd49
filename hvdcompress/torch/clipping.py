"""Local gradient clipping for the torch optimizer (see :mod:`hvdcompress.clipping`)."""
from __future__ import annotations

from typing import Sequence

import torch

from ..clipping import local_clip_limit


def clip_local_gradients(grads: Sequence[torch.Tensor], clip_grad_norm: float, world: int,
                         average: bool = True) -> None:
    """Scale ``grads`` in place so that their global L2 norm is at most
    :func:`~hvdcompress.clipping.local_clip_limit` (c·sqrt(N) for op=Average, c/sqrt(N) for Sum).

    Same formula as ``torch.nn.utils.clip_grad_norm_`` (coefficient ``limit / (norm + 1e-6)``
    clamped to 1), computed on the device without reading the norm on the host; sparse
    gradients count with their (coalesced) values.
    """
    if not grads:
        return
    norms = [torch.linalg.vector_norm(g.coalesce().values() if g.is_sparse else g, dtype=torch.float32)
             for g in grads]
    total = torch.linalg.vector_norm(torch.stack(norms))
    coef = torch.clamp(local_clip_limit(clip_grad_norm, world, average) / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))
