"""FSDP2's custom reduce-scatter (``FSDPModule.set_custom_reduce_scatter``) through a
:class:`hvdcompress.torch.fsdp.CompressionState` (installed by :func:`hvdcompress.torch.fsdp.compress`)."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def units(module: torch.nn.Module) -> list:
    """``(name, FSDPModule)`` of every ``FSDPModule`` under ``module``, named by its module path
    (the root ``root``): the units of the compressed reduce-scatter's state, in module order."""
    from torch.distributed.fsdp import FSDPModule
    return [(name or "root", m) for name, m in module.named_modules() if isinstance(m, FSDPModule)]


def install(found: list, state: Any) -> None:
    """``state``'s compressed reduce-scatter on each of the :func:`units` ``found``."""
    for name, m in found:
        m.set_custom_reduce_scatter(CompressedReduceScatter(state, name))


class CompressedReduceScatter:
    """FSDP2's reduce-scatter communication (``FSDPModule.set_custom_reduce_scatter``) for one
    module, through ``state``: ``allocate`` plain buffers; ``__call__`` the compressed
    reduce-scatter, synchronous, with ``op`` AVG (divided by the group's size) or SUM."""

    def __init__(self, state: Any, name: str):
        self.state = state
        self.name = name

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 op: Any, async_op: bool = False) -> None:
        if op == dist.ReduceOp.AVG:
            scale = 1.0 / group.size()
        elif op == dist.ReduceOp.SUM:
            scale = 1.0
        else:
            raise ValueError(f"FSDP2 asked module '{self.name}' for a reduce-scatter with op={op}: the "
                             "compressed reduce-scatter runs AVG and SUM; leave set_gradient_divide_factor "
                             "at its default (or at the world size)")
        self.state.reduce_scatter(self.name, input_tensor, output_tensor, scale)
