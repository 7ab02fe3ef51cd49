"""Rank agreement for the torch optimizer: every rank must send the same tensors the same way.

A rank that differs in its parameters (names, shapes, dtypes), compressor, accumulation or
collective would hang or corrupt the exchange; :func:`check_ranks_agree` gathers each rank's
description once at construction (one allgather of a few hundred bytes) and fails on every rank,
naming the first difference.
"""
from __future__ import annotations

import pickle
from typing import Any

import horovod.torch as hvd
import numpy as np
import torch


def allgather_object(obj: Any, process_set: Any) -> list:
    """Every rank's ``obj`` (pickled), over ``process_set``, in rank order."""
    data = torch.from_numpy(np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy())
    sizes = hvd.allgather(torch.tensor([data.numel()]), name="hvdc.meta.sizes", process_set=process_set)
    blob = hvd.allgather(data, name="hvdc.meta.blob", process_set=process_set)
    out, start = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(blob[start:start + n].numpy().tobytes()))
        start += n
    return out


def check_ranks_agree(mine: dict, process_set: Any, rank: int) -> None:
    """Raise ``ValueError`` on every rank if any rank's ``mine`` differs from this rank's.

    ``mine`` maps a setting to its value on this rank; the ``"params"`` entry is a list of
    (name, shape, dtype) and is reported as the symmetric difference (first 5 entries), the
    other settings as the pair of values.
    """
    everyone = allgather_object(mine, process_set)
    for other_rank, other in enumerate(everyone):
        if other == mine:
            continue
        for key in mine:
            if other[key] != mine[key]:
                diff = (sorted(set(map(str, mine[key])) ^ set(map(str, other[key])))[:5]
                        if key == "params" else [mine[key], other[key]])
                raise ValueError(f"hvdcompress.torch.DistributedOptimizer: ranks disagree on "
                                 f"{key}: this rank (index {rank}) vs rank "
                                 f"index {other_rank}; differing entries: {diff}")
