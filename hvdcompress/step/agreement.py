"""Rank agreement: every rank must send the same tensors the same way.

A rank that differs in its tensors (names, shapes, dtypes), compressor, accumulation or
collective would hang or corrupt the exchange. :func:`check_ranks_agree` gathers each rank's
description once (two allgathers of a few hundred bytes, through the front end's
:class:`~hvdcompress.transport.collectives.Collectives`) and fails on every rank, naming the first
difference. The torch optimizer runs it at construction, the TF tape and Keras optimizer at
their first exchange (their variables are known then).
"""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from ..ops.facade import Ops, Tensor
from ..transport.collectives import Collectives
from ..transport.objects import allgather_object


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
