"""Momentum take-over between a ``torch.optim.SGD`` and a compressor that applies momentum itself.

Compressors with ``takes_over_momentum`` (DGC, CSC, the Momentum decorator) apply the momentum
and weight decay before compressing: the exchanged update is already ``u ← μu + g + λw`` (or
its Nesterov form), so the optimizer must then take a plain SGD step ``w ← w − η·update``.
For a ``torch.optim.SGD`` the wrapper reads each group's ``momentum``, ``nesterov`` and
``weight_decay`` at every step (:func:`momentum_fields`, handed to the compressor in its
:class:`~hvdcompress.contract.compressor.TensorInfo`) and runs the wrapped ``step()`` with them set to 0,
restored right after (:func:`suspended`), so ``param_groups``, LR/momentum schedulers and
checkpoints keep the user's values. A compressor with an explicit momentum next to an SGD with
momentum is an error (momentum would apply twice, :func:`check_momentum`). Other optimizers
(Adam, ...) are left alone, and DGC then uses its own ``momentum`` (default 0).
"""
from __future__ import annotations

import warnings
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator, Optional

import torch

from ..adam.settings import adam_settings
from ..contract.compressor import Compressor

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


def check_adam(compressor: Compressor, optimizer: torch.optim.Optimizer):
    """The :class:`~hvdcompress.adam.frozen.FrozenAdam` that takes ``optimizer``'s step over (None
    without one), after checking that the optimizer is an Adam or AdamW it can run; a warning
    when a compressor with SGD's momentum correction (DGC, CSC, ``Momentum``) wraps an
    optimizer that is not SGD."""
    if compressor.takes_over_momentum and not isinstance(optimizer, torch.optim.SGD):
        warnings.warn(f"{compressor.name} applies SGD's momentum correction, but the optimizer is "
                      f"{type(optimizer).__name__}: the take-over runs only with torch.optim.SGD, so "
                      f"{compressor.name} runs with momentum {compressor.explicit_momentum or 0} "
                      "(top-k with a residual) next to the optimizer's own update. With Adam or "
                      "AdamW use FrozenAdam (\"adam\": \"frozen\") around a compressor without "
                      "momentum, e.g. FrozenAdam(ErrorFeedback(OneBit())) or FrozenAdam(ErrorFeedback(TopK(0.01)))",
                      stacklevel=4)
    if not compressor.takes_over_adam:
        return None
    if not isinstance(optimizer, torch.optim.Adam):
        raise ValueError(f"compression={compressor!r} takes over Adam's step, but the optimizer is "
                         f"{type(optimizer).__name__}; allowed: torch.optim.Adam or torch.optim.AdamW")
    for i, group in enumerate(optimizer.param_groups):
        adam_settings(group, i)
    return compressor


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


def hook_optimizer(compressor: Compressor, optimizer: Optional[torch.optim.Optimizer],
                   adam_step: Callable) -> Any:
    """The take-overs of a hook front end (DDP, FSDP) on the user's ``optimizer``, which it does
    not wrap: checked against the compressor, then the momentum take-over's suspension around its
    step (step pre- and post-hooks), or ``adam_step`` in place of its ``step`` (on the instance)
    with FrozenAdam, which is returned (None otherwise)."""
    if optimizer is None:
        if compressor.takes_over_momentum and compressor.explicit_momentum is None:
            warnings.warn(f"{compressor.name} applies SGD's momentum itself, but no optimizer= "
                          "was given: it runs with momentum 0 (top-k with a residual). Pass "
                          "optimizer=your torch.optim.SGD so it takes that momentum over", stacklevel=3)
        return None
    check_momentum(compressor, optimizer)
    adam = check_adam(compressor, optimizer)
    if takes_over(compressor, optimizer):
        suspension = ExitStack()

        def suspend(opt: torch.optim.Optimizer, *_: Any) -> None:
            suspension.close()   # a step that raised left them at 0
            suspension.enter_context(suspended(opt, True))
        optimizer.register_step_pre_hook(suspend)
        optimizer.register_step_post_hook(lambda *_: suspension.close())
    if adam is not None:
        optimizer.step = adam_step
    return adam
