"""Momentum take-over between a ``torch.optim.SGD`` and a compressor that applies momentum itself.

Compressors with ``takes_over_momentum`` (DGC, CSC, the Momentum decorator) apply the momentum
and weight decay before compressing: the exchanged update is already ``u ← μu + g + λw`` (or
its Nesterov form), so the optimizer must then take a plain SGD step ``w ← w − η·update``.
For a ``torch.optim.SGD`` the wrapper reads each group's ``momentum``, ``nesterov`` and
``weight_decay`` at every step (:func:`momentum_fields`, handed to the compressor in its
:class:`~hvdcompress.compressor.TensorInfo`) and runs the wrapped ``step()`` with them set to 0,
restored right after (:func:`suspended`), so ``param_groups``, LR/momentum schedulers and
checkpoints keep the user's values. A compressor with an explicit momentum next to an SGD with
momentum is an error (momentum would apply twice, :func:`check_momentum`). Other optimizers
(Adam, ...) are left alone, and DGC then uses its own ``momentum`` (default 0).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from ..compressor import Compressor

TAKEN_OVER = ("momentum", "nesterov", "weight_decay")


def takes_over(compressor: Compressor, optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``compressor`` applies ``optimizer``'s momentum and weight decay itself."""
    return compressor.takes_over_momentum and isinstance(optimizer, torch.optim.SGD)


def check_momentum(compressor: Compressor, optimizer: torch.optim.Optimizer) -> None:
    """Reject settings the take-over cannot honour: dampening, or momentum on both sides."""
    if not takes_over(compressor, optimizer):
        return
    explicit = compressor.explicit_momentum
    for i, g in enumerate(optimizer.param_groups):
        if g.get("dampening", 0):
            raise ValueError(f"param_groups[{i}] dampening={g['dampening']!r}: {compressor.name} "
                             "applies momentum itself and supports dampening=0 only")
        if explicit is not None and g.get("momentum", 0):
            raise ValueError(f"param_groups[{i}] momentum={g['momentum']!r} and the compressor's "
                             f"momentum={explicit!r}: momentum would be applied twice; set one of "
                             "them to 0 (or leave the compressor's at None to take the optimizer's)")


def momentum_fields(group: dict) -> dict:
    """The :class:`TensorInfo` fields ``momentum``, ``nesterov``, ``weight_decay`` of a param group."""
    return {"momentum": float(group.get("momentum", 0.0)),
            "nesterov": bool(group.get("nesterov", False)),
            "weight_decay": float(group.get("weight_decay", 0.0))}


@contextmanager
def suspended(optimizer: torch.optim.Optimizer, active: bool) -> Iterator[None]:
    """With ``active``, zero the settings the compressor applied itself in every param group
    for the duration of the block (the wrapped optimizer's step), then restore them."""
    saved = []
    if active:
        for group in optimizer.param_groups:
            values = {k: group[k] for k in TAKEN_OVER if k in group}
            saved.append((group, values))
            group.update({k: (False if k == "nesterov" else 0.0) for k in values})
    try:
        yield
    finally:
        for group, values in saved:
            group.update(values)
