"""What the exchange engine's rounds carry (:mod:`hvdcompress.engines.exchange`): each tensor in the
exchange (:class:`Entry`), what it sends in a round (:class:`Send`), a launched round
(:class:`Round`), and a round's all-to-all fused into one tensor per dtype
(:func:`launch_alltoall`, undone by :func:`wait`)."""
from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional

from ..contract.compressor import Packet, TensorInfo
from ..ops.facade import Ops, Tensor
from .collectives import Collectives


@dataclass
class Entry:
    """One tensor in the exchange: ``key`` is the wrapper's handle on it (a parameter, an
    index); ``total`` is set when it is done (None for an empty tensor)."""

    key: Any
    info: TensorInfo
    state: MutableMapping
    collective: str = "allreduce"
    packet: Optional[Packet] = None
    segments: list = field(default_factory=list)   # alltoall: (ctx, info) of each segment
    total: Optional[Tensor] = None


class Send(NamedTuple):
    """What one entry sends in a round: ``tensors`` through ``collective``;
    ``then(entry, received, collective, out_of)`` takes what came back and returns the entry's
    next :class:`Send`, or None when its total is set (None: the engine's default,
    :meth:`Exchange.after_round`)."""

    entry: Entry
    tensors: list
    collective: str
    then: Optional[Callable] = None


class FusedAlltoall(NamedTuple):
    """A round's all-to-all of ``count`` tensors, launched as one tensor per dtype: ``layout``
    holds each launched tensor's (input positions, per-rank part lengths)."""

    count: int
    layout: list
    handle: Any


@dataclass
class Round:
    """A launched round: what each entry sends, the handle of each collective."""

    sends: list           # [Send]
    handles: dict         # collective -> handle
    number: int


def launch_alltoall(ops: Ops, comm: Collectives, tensors: list, tag: str) -> FusedAlltoall:
    """A round's all-to-all as one tensor per dtype: Horovod has no grouped all-to-all,
    and each call is its own negotiation and its own P-way exchange (at 16 ranks on 2
    cores, one per tensor and round cost seconds per step). Part j of every tensor, side by
    side, goes to rank j; :func:`wait` cuts what arrives back into the tensors."""
    positions: dict = {}
    for i, t in enumerate(tensors):
        positions.setdefault(t.dtype, []).append(i)
    layout, fused = [], []
    for idx in positions.values():
        widths = [ops.numel(tensors[i]) // comm.world for i in idx]
        parts = [ops.split(tensors[i], [w] * comm.world) for i, w in zip(idx, widths)]
        fused.append(tensors[idx[0]] if len(idx) == 1 else
                     ops.concat([part[j] for j in range(comm.world) for part in parts]))
        layout.append((idx, widths))
    return FusedAlltoall(len(tensors), layout, comm.alltoall(fused, tag))


def wait(ops: Ops, comm: Collectives, handle: Any) -> list:
    """The outputs of a launched collective, in input order (a fused all-to-all's un-fused)."""
    if not isinstance(handle, FusedAlltoall):
        return comm.wait(handle)
    out: list = [None] * handle.count
    for (idx, widths), got in zip(handle.layout, comm.wait(handle.handle)):
        if len(idx) == 1:
            out[idx[0]] = got
            continue
        pieces = ops.split(got, widths * comm.world)
        for k, i in enumerate(idx):
            out[i] = ops.concat(pieces[k::len(idx)])
    return out
