"""FSDP2's parameter all-gather quantised (``fsdp.compress(model, all_gather=Int8())``), qwZ-style.

FSDP2 (``fully_shard``) all-gathers each unit's parameters before its forward and again before
its backward (``reshard_after_forward``); ``FSDPModule.set_custom_all_gather(comm)`` hands the
unit's flat shard (``input_tensor``, this rank's slot of ``output_tensor``) and the unsharded
buffer ``output_tensor`` (P shards side by side) to ``comm(output_tensor, input_tensor, group,
async_op)``. Here each rank quantises its shard, one all-gather carries every rank's bounds and
codes, and each rank decodes every shard into the buffer: the rule, its error bound (per element
``(max − min)/510`` per gather for int8, no accumulation: the master shards stay exact) and the
trade-off are :mod:`hvdcompress.engines.all_gather`'s. Synchronous (returns no work handle, which
FSDP2 accepts).

Bytes: the state's ``all_gather_bytes`` (a :class:`~hvdcompress.engines.accounting.ByteCount`)
counts, per gather, this rank's shard in the all-gather dtype (``dense``: what FSDP's own
all-gather sends) against its payload (``sent``: codes and bounds), and ``total_bytes`` adds it
to the gradients'. FULL_SHARD with FSDP2 only: FSDP1 has no all-gather hook and HSDP is refused
by :func:`hvdcompress.torch.fsdp.compress`.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist

from ..contract.compressor import Compressor
from ..engines.accounting import ByteCount
from ..engines.all_gather import ParameterCodec
from ..registry import as_compressor
from .tensors import OPS


def codec(module: torch.nn.Module, all_gather: Union[Compressor, Mapping, None]) -> Optional[ParameterCodec]:
    """The codec of ``all_gather`` (None: FSDP's own all-gather), or a ValueError for what cannot run."""
    if all_gather is None:
        return None
    from torch.distributed.fsdp import FullyShardedDataParallel
    if any(isinstance(m, FullyShardedDataParallel) for m in module.modules()):
        raise ValueError("compress: all_gather= needs FSDP2 (torch.distributed.fsdp.fully_shard), whose "
                         "set_custom_all_gather carries the parameters; FSDP1 (FullyShardedDataParallel) "
                         "has no all-gather hook")
    return ParameterCodec(as_compressor(all_gather), OPS)


def install(units: Sequence, gather_codec: Optional[ParameterCodec], counts: ByteCount) -> None:
    """``set_custom_all_gather`` on every ``(name, FSDPModule)`` of ``units``, counting into ``counts``."""
    for name, m in units if gather_codec is not None else ():
        m.set_custom_all_gather(QuantisedAllGather(gather_codec, counts, name))


class QuantisedAllGather:
    """FSDP2's all-gather communication for one unit: ``allocate`` plain buffers; ``__call__``
    the quantised all-gather (module doc)."""

    def __init__(self, gather_codec: ParameterCodec, counts: ByteCount, name: str):
        self.codec = gather_codec
        self.counts = counts
        self.name = name

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 async_op: bool = False) -> None:
        if not input_tensor.is_floating_point():
            raise ValueError(f"unit '{self.name}': FSDP2 all-gathers its parameters as {input_tensor.dtype} "
                             "(a custom pre-all-gather or float8); all_gather= quantises float parameters only")
        world, n = group.size(), input_tensor.numel()
        codes, bounds = self.codec.encode(input_tensor.reshape(-1), self.name)   # before the slot is overwritten
        split = bounds.numel() * bounds.element_size()
        mine = torch.cat([bounds.view(torch.uint8), codes])
        gathered = mine.new_empty(world * mine.numel())
        dist.all_gather_single(gathered, mine, group=group)
        rows, out = gathered.view(world, -1), output_tensor.view(world, n)
        for r in range(world):   # bounds copied out of the row: a float32 view needs 4-byte alignment
            self.codec.decode(rows[r, split:], rows[r, :split].clone().view(torch.float32), self.name, out[r])
        self.counts.add(n * input_tensor.element_size(), mine.numel())
