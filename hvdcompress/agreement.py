"""Rank agreement: every rank must send the same tensors the same way.

A rank that differs in its tensors (names, shapes, dtypes), compressor, accumulation or
collective would hang or corrupt the exchange. :func:`check_ranks_agree` gathers each rank's
description once (two allgathers of a few hundred bytes, through the front end's
:class:`~hvdcompress.collectives.Collectives`) and fails on every rank, naming the first
difference. The torch optimizer runs it at construction, the TF tape and Keras optimizer at
their first exchange (their variables are known then).
"""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from .backend import Ops, Tensor
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


def check_ranks_agree(mine: dict, comm: Collectives, ops: Ops, like: Tensor, who: str) -> None:
    """Raise ``ValueError`` on every rank if any rank's ``mine`` differs from this rank's.

    ``mine`` maps a setting to its value on this rank; the ``"params"`` entry is a list of
    (name, shape, dtype) and is reported as the symmetric difference (first 5 entries), the
    other settings as the pair of values. ``who``: the front end, for the message.
    """
    everyone = allgather_object(mine, comm, ops, like)
    for other_rank, other in enumerate(everyone):
        if other == mine:
            continue
        for key in mine:
            if other.get(key) != mine[key]:
                diff = (sorted(set(map(str, mine[key])) ^ set(map(str, other[key])))[:5]
                        if key == "params" else [mine[key], other.get(key)])
                raise ValueError(f"{who}: ranks disagree on {key}: this rank (index {comm.rank}) "
                                 f"vs rank index {other_rank}; differing entries: {diff}")
