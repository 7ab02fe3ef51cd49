"""Rank agreement: every rank must send the same tensors the same way.

A rank that differs in its tensors (names, shapes, dtypes), compressor tree, accumulation,
collective, clip, predivide or any other setting of
:meth:`hvdcompress.step.options.Options.agreement` would hang or corrupt the exchange, or let the
replicas drift apart. :func:`check_ranks_agree` gathers each rank's description once (two
allgathers of a few hundred bytes, through the front end's
:class:`~hvdcompress.transport.collectives.Collectives`) and fails with the same ``ValueError``
on every rank, naming the first setting that differs and each rank's value. The step driver runs
it (:meth:`hvdcompress.step.driver.StepDriver.agree`) before the first collective of the
exchange: the torch optimizer at construction, the DDP and FSDP hooks at their first bucket or
reduce-scatter, the TF tape and Keras optimizer at their first exchange (their variables are
known then).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ..ops.facade import Ops, Tensor
from ..transport.collectives import Collectives
from ..transport.objects import allgather_object

MISSING = "<missing>"   # a setting some rank's description lacks


def check_ranks_agree(mine: dict, comm: Collectives, ops: Ops, like: Tensor, who: str) -> None:
    """Raise one ``ValueError`` on every rank if the ranks' ``mine`` differ (:func:`disagreement`).

    ``mine`` maps a setting to its value on this rank; ``who``: the front end, for the message.
    Every rank gathers every rank's ``mine`` and words the same message from them.
    """
    message = disagreement(allgather_object(mine, comm, ops, like))
    if message is not None:
        raise ValueError(f"{who}: {message}")


def disagreement(everyone: Sequence[Mapping]) -> Optional[str]:
    """The first setting on which the ranks' descriptions ``everyone`` (by rank index) differ,
    with each rank's value; None when they agree. Settings are taken in the first rank's order,
    then any that only other ranks have (``<missing>`` where a rank lacks one). The
    ``"params"`` entry, a list of (name, shape, dtype), is reported as the entries of each
    differing rank and of rank index 0 that the other lacks (first 5 each)."""
    keys = list(dict.fromkeys(key for description in everyone for key in description))
    for key in keys:
        values = [description.get(key, MISSING) for description in everyone]
        if any(v != values[0] for v in values):
            detail = _params_difference(values) if key == "params" else _by_value(values)
            return f"ranks disagree on {key}: {detail}"
    return None


def _ranks(indices: Sequence[int]) -> str:
    shown = ", ".join(map(str, indices[:8])) + (", ..." if len(indices) > 8 else "")
    return f"rank index {shown}" if len(indices) == 1 else f"rank indices {shown}"


def _by_value(values: Sequence[Any]) -> str:
    """``rank index 0: A; rank index 1: B``, ranks of equal values together."""
    groups: dict = {}
    for index, value in enumerate(values):
        groups.setdefault(value if isinstance(value, str) else repr(value), []).append(index)
    return "; ".join(f"{_ranks(indices)}: {value}" for value, indices in groups.items())


def _params_difference(values: Sequence[Any]) -> str:
    first = set(map(str, values[0]))
    parts = []
    for index, value in enumerate(values):
        own = set(map(str, value)) if value != MISSING else set()
        if own != first:
            parts.append(f"rank index {index} has {_first(own - first)} where rank index 0 has "
                         f"{_first(first - own)}")
    return "(name, shape, dtype) " + "; ".join(parts)


def _first(entries: set) -> str:
    shown = sorted(entries)
    return ", ".join(shown[:5]) + (", ..." if len(shown) > 5 else "") if shown else "none"
