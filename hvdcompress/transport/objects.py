"""Small Python objects from every rank: pickled, sized and gathered over a process set's
:class:`~hvdcompress.transport.collectives.Collectives` (two allgathers). The rank agreement, the
state store and the planner's probes use it for metadata, never for tensors of a step."""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from ..ops.facade import Ops, Tensor
from .collectives import Collectives


def allgather_object(obj: Any, comm: Collectives, ops: Ops, like: Tensor) -> list:
    """Every rank's ``obj`` (pickled), over ``comm``'s process set, in rank order. ``like``: a
    tensor on the device the bytes travel from."""
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy()
    sizes = comm.wait(comm.allgather([ops.from_numpy(np.array([data.size], np.int64), like)],
                                     "hvdc.meta.sizes"))[0]
    blob = ops.to_numpy(comm.wait(comm.allgather([ops.from_numpy(data, like)], "hvdc.meta.blob"))[0])
    out, start = [], 0
    for n in ops.to_numpy(sizes).tolist():
        out.append(pickle.loads(blob[start:start + n].tobytes()))
        start += n
    return out
