"""torch.distributed's collectives over one process group, for the exchange engine
(:class:`hvdcompress.transport.collectives.Collectives`): the adapter of the DDP communication hook
(:mod:`hvdcompress.torch.ddp`), written for Gloo (CPU) and NCCL (GPU).

Every call launches asynchronous work (``async_op=True``) and returns a handle; :meth:`wait`
blocks on it and returns the outputs in input order. A grouped call fuses its tensors:

* ``allreduce``: the tensors of one dtype are concatenated into one flat buffer and summed by
  one ``all_reduce`` (one copy in, views out; torch.distributed has no grouped allreduce that
  takes several dtypes at once).
* ``allgather``: per-rank payloads may differ in size from rank to rank (DGC's and
  threshold's selections), which ``all_gather_into_tensor`` does not allow (Horovod's
  allgather does). So each grouped call first all-gathers every tensor's byte length (one
  int64 per tensor, a blocking round trip of a few bytes: the only host read of the adapter),
  then the bytes of all its tensors, whatever their dtypes (gathering only moves them; Gloo has
  no int16 or uint16 arithmetic, and needs none here), concatenated and zero-padded to the
  longest rank's total, go through one ``all_gather_into_tensor``; each tensor's pieces are cut
  back out. Bytes on the wire: (P-1) · the longest rank's payload, instead of (P-1) · its own.
* ``alltoall``: one ``all_to_all_single`` of bytes per tensor (the engine already fuses a
  round's all-to-all into one tensor per dtype).

The calls are issued in the caller's thread, in the engine's order, so every rank issues the
same collectives in the same order (Gloo and NCCL match them by order).
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple, Optional

import torch
import torch.distributed as dist

from ..transport.collectives import Collectives
from ..transport.process_sets import node_layout

#: all_gather_into_tensor's new name (torch 2.13 deprecates the old one)
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class _Fused(NamedTuple):
    """A launched grouped call: its ``works`` (None: nothing to send), their output
    ``buffers``, and how each input tensor is cut out of them: (buffer position,
    [(start, length), ...] per rank, dtype, shape)."""

    works: list
    buffers: list
    pieces: list


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes, flat (a view when it is contiguous): what only moves needs no dtype, so the
    tensors of every dtype share one collective, whichever dtypes the backend can add."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def _by_dtype(tensors: list) -> dict:
    """dtype -> positions of ``tensors`` of that dtype, in input order."""
    groups: dict = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return groups


class DistCollectives(Collectives):
    """The engine's collectives over ``group`` (None: the default process group)."""

    def __init__(self, group: Optional[Any] = None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def allreduce(self, tensors: list, tag: str) -> _Fused:
        works, buffers, pieces = [], [], [None] * len(tensors)
        for positions in _by_dtype(tensors).values():
            flat = torch.cat([tensors[i].reshape(-1) for i in positions])
            works.append(dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group, async_op=True))
            start = 0
            for i in positions:
                pieces[i] = (len(buffers), [(start, tensors[i].numel())], tensors[i].dtype, tensors[i].shape)
                start += tensors[i].numel()
            buffers.append(flat)
        return _Fused(works, buffers, pieces)

    def allgather(self, tensors: list, tag: str) -> _Fused:
        data = [_as_bytes(t) for t in tensors]
        mine = torch.tensor([d.numel() for d in data], dtype=torch.int64, device=data[0].device)
        sizes = mine.new_empty(self.world * len(data))
        _ALL_GATHER(sizes, mine, group=self.group)
        sizes = sizes.view(self.world, len(data)).tolist()
        longest = max(sum(row) for row in sizes)
        flat = torch.cat(data + [data[0].new_zeros(longest - sum(sizes[self.rank]))])
        out = flat.new_empty(self.world * longest)
        work = _ALL_GATHER(out, flat, group=self.group, async_op=True) if longest else None
        pieces, starts = [], [r * longest for r in range(self.world)]
        for i, t in enumerate(tensors):
            spans = []
            for r in range(self.world):
                spans.append((starts[r], sizes[r][i]))
                starts[r] += sizes[r][i]
            pieces.append((0, spans, t.dtype, (-1, *t.shape[1:])))
        return _Fused([work], [out], pieces)

    def alltoall(self, tensors: list, tag: str) -> _Fused:
        data = [_as_bytes(t) for t in tensors]
        outs = [torch.empty_like(d) for d in data]
        works = [dist.all_to_all_single(o, d, group=self.group, async_op=True) for o, d in zip(outs, data)]
        return _Fused(works, outs, [(i, [(0, d.numel())], t.dtype, t.shape) for i, (d, t) in enumerate(zip(data, tensors))])

    def pairs_take_turns(self, on_gpu: bool) -> bool:
        return dist.get_backend(self.group) == "gloo"

    def wait(self, handle: _Fused) -> list:
        for work in handle.works:
            if work is not None:
                work.wait()
        out = []
        for position, spans, dtype, shape in handle.pieces:
            flat = handle.buffers[position].view(-1)
            parts = [flat.narrow(0, start, length) for start, length in spans]
            in_place = len(parts) == 1 and (flat.dtype == dtype or spans[0][0] == 0)
            # else the ranks' pieces, or bytes at an offset, in a new tensor (aligned for the view)
            got = parts[0] if in_place else torch.cat(parts)
            out.append(got.view(dtype).view(shape))
        return out


def node_groups(ranks_per_node: Optional[int] = None) -> tuple:
    """(this rank's node group, its cross-node group) for two-level compression, made with
    ``dist.new_group`` on every rank (all ranks must call this, in the same order): N node
    groups of L consecutive ranks, then L cross-node groups (:func:`hvdcompress.transport.process_sets.node_layout`).
    ``ranks_per_node`` defaults to torchrun's ``LOCAL_WORLD_SIZE``; ranks must be placed node by
    node (torchrun does)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if ranks_per_node is None:
        if "LOCAL_WORLD_SIZE" not in os.environ:
            raise ValueError("intra_node=... with ranks_per_node=None needs torchrun's "
                             "LOCAL_WORLD_SIZE; pass ranks_per_node=L (the ranks of one node)")
        ranks_per_node = int(os.environ["LOCAL_WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank % ranks_per_node))
        if local != rank % ranks_per_node:
            raise ValueError(f"rank {rank} is local rank {local}, not {rank % ranks_per_node}: "
                             "two-level compression needs ranks placed node by node with the same "
                             "number of ranks on every node")
    nodes, cross = node_layout(world, ranks_per_node)
    groups = [dist.new_group(ranks) for ranks in nodes + cross]
    return groups[rank // ranks_per_node], groups[len(nodes) + rank % ranks_per_node]


def whole_group(process_group: Any) -> dict:
    """:func:`hvdcompress.step.options.parse_options`' process-set arguments for a
    torch.distributed front end: ``process_group`` (None: every rank) against the world group."""
    world = getattr(dist.group, "WORLD", None)
    return {"process_set": world if process_group is None else process_group, "global_set": world,
            "set_argument": ("process_group", "None")}


def node_collectives(ranks_per_node: Optional[int] = None) -> tuple:
    """:func:`node_groups`' two groups as :class:`DistCollectives` (the two-level engine's ``node_comms``)."""
    return tuple(map(DistCollectives, node_groups(ranks_per_node)))
