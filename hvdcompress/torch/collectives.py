"""Horovod's torch collectives over one process set, for the exchange engine
(:class:`hvdcompress.transport.collectives.Collectives`): asynchronous grouped calls, waited on in
``synchronize()``, so communication overlaps the backward pass."""
from __future__ import annotations

from typing import Any, Optional

import horovod.torch as hvd

from ..transport import process_sets
from ..transport.collectives import Collectives
from ..transport.waiting import wait_politely


class HorovodCollectives(Collectives):
    """``hvd.grouped_allreduce_async_`` (op=Sum), ``hvd.grouped_allgather_async`` and
    ``hvd.alltoall_async`` (one per tensor given: Horovod has no grouped alltoall; the engine
    hands it one tensor per dtype and round) over ``process_set``.

    The global process set is asked through ``horovod.torch`` itself: a ProcessSet answers
    through whichever Horovod framework module was imported last, so a process that also
    imported horovod.tensorflow would otherwise ask the wrong library."""

    def __init__(self, process_set: Any = hvd.global_process_set):
        self.process_set = process_set

    @property
    def world(self) -> int:  # type: ignore[override]
        ps = self.process_set
        return hvd.size() if ps is hvd.global_process_set else ps.size()

    @property
    def rank(self) -> int:  # type: ignore[override]
        ps = self.process_set
        return hvd.rank() if ps is hvd.global_process_set else ps.rank()

    def included(self) -> bool:
        return self.process_set is hvd.global_process_set or self.process_set.included()

    def allreduce(self, tensors: list, tag: str) -> Any:
        return hvd.grouped_allreduce_async_(tensors, name=tag, op=hvd.Sum, process_set=self.process_set)

    def allgather(self, tensors: list, tag: str) -> Any:
        return hvd.grouped_allgather_async(tensors, name=tag, process_set=self.process_set)

    def alltoall(self, tensors: list, tag: str) -> Any:
        return [hvd.alltoall_async(t, name=f"{tag}.{i}", process_set=self.process_set)
                for i, t in enumerate(tensors)]

    def pairs_take_turns(self, on_gpu: bool) -> bool:
        return not on_gpu and hvd.gloo_enabled()   # CPU tensors go through Gloo when it runs

    def wait(self, handle: Any) -> list:
        """The outputs, once Horovod reports the handle done (polled with pauses,
        :mod:`hvdcompress.transport.waiting`: ``hvd.synchronize`` alone keeps a core busy meanwhile)."""
        if isinstance(handle, list):  # alltoall: (output, received splits) per tensor
            return [self._wait(h)[0] for h in handle]
        return list(self._wait(handle))

    @staticmethod
    def _wait(handle: Any) -> Any:
        wait_politely(lambda: hvd.poll(handle))
        return hvd.synchronize(handle)


def node_process_sets(ranks_per_node: Optional[int] = None) -> list:
    """The process sets of two-level compression (``intra_node=``), to register on every rank:
    ``hvd.init(process_sets=hvdcompress.torch.node_process_sets())``. Computed from horovodrun's
    HOROVOD_SIZE / HOROVOD_LOCAL_SIZE before ``hvd.init`` (``ranks_per_node`` overrides the local
    size, e.g. to emulate nodes on one machine); see :mod:`hvdcompress.transport.process_sets`."""
    return process_sets.node_process_sets(hvd, ranks_per_node)
