"""Horovod's TensorFlow collectives over one process set, for the exchange engine
(:class:`hvdcompress.transport.collectives.Collectives`). They run eagerly inside the exchange's
``tf.py_function``, so each call completes at once and is its own handle."""
from __future__ import annotations

import re
from typing import Any, Optional

import horovod.tensorflow as hvd
import tensorflow as tf

from ..transport import process_sets
from ..transport.collectives import Collectives


class HorovodCollectives(Collectives):
    """``hvd.grouped_allreduce`` (op=Sum), ``hvd.grouped_allgather`` (one call per dtype: Horovod's
    grouped TF ops take a single dtype) and ``hvd.alltoall`` over ``process_set``, on
    ``device``."""

    def __init__(self, process_set: Any, device: str = ""):
        self.process_set = process_set
        self.device = device

    @property
    def world(self) -> int:  # type: ignore[override]
        return self.process_set.size()

    @property
    def rank(self) -> int:  # type: ignore[override]
        return self.process_set.rank()

    @staticmethod
    def _name(tag: str) -> str:
        """A valid TF op name (variable paths hold '/' and ':')."""
        return re.sub(r"[^A-Za-z0-9_.\-]", "_", tag)

    def allreduce(self, tensors: list, tag: str) -> list:
        return self._per_dtype(lambda ts, name: hvd.grouped_allreduce(
            ts, op=hvd.Sum, process_set=self.process_set, name=name), tensors, tag)

    def allgather(self, tensors: list, tag: str) -> list:
        return self._per_dtype(lambda ts, name: hvd.grouped_allgather(
            ts, process_set=self.process_set, name=name), tensors, tag)

    def alltoall(self, tensors: list, tag: str) -> list:
        with tf.device(self.device):
            return [hvd.alltoall(t, process_set=self.process_set, name=self._name(f"{tag}.{i}"))
                    for i, t in enumerate(tensors)]

    def pairs_take_turns(self, on_gpu: bool) -> bool:
        return not on_gpu and hvd.gloo_enabled()   # CPU tensors go through Gloo when it runs

    def wait(self, handle: Any) -> list:
        return handle

    def _per_dtype(self, collective, tensors: list, tag: str) -> list:
        """``collective(tensors_of_one_dtype, name)`` for each dtype; results in input order."""
        positions: dict = {}
        for i, t in enumerate(tensors):
            positions.setdefault(t.dtype, []).append(i)
        out: list = [None] * len(tensors)
        with tf.device(self.device):
            for dtype, idx in positions.items():
                for i, result in zip(idx, collective([tensors[i] for i in idx],
                                                     self._name(f"{tag}.{dtype.name}"))):
                    out[i] = result
        return out


def node_process_sets(ranks_per_node: Optional[int] = None) -> list:
    """The process sets of two-level compression (``intra_node=``), to register on every rank:
    ``hvd.init(process_sets=hvdcompress.tensorflow.node_process_sets())`` (see
    :func:`hvdcompress.torch.node_process_sets` and :mod:`hvdcompress.transport.process_sets`)."""
    return process_sets.node_process_sets(hvd, ranks_per_node)
