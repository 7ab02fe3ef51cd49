"""Checkpoints of the compressor state, for every front end that keeps it in tensors of its own.

What a checkpoint holds (``'hvdcompress'`` in a torch optimizer's ``state_dict``, the DDP and
FSDP states' ``state_dict``): the compressor's own state (schedules, step counters), the world
size and op of the run, and every tensor's buffers (residuals, momenta, velocities) keyed by
tensor name: this rank's (``'tensors'``), or with ``gather=True`` every rank's (``'ranks'``, host
copies, in rank order; a collective, one allgather of the state).

Loading: a gathered checkpoint is redistributed to this run's world size and rank by the rule of
:mod:`hvdcompress.state.reshard` (the unsent error-feedback mass and the mean momentum are kept); one
rank's checkpoint, which holds that rank's residuals only, loads at the same world size and is
refused at another one with a ``ValueError`` that says how to save one that resumes anywhere.

The framework enters through :class:`Conversions` (copies, the host, numpy, dtypes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from ..transport.objects import allgather_object
from .reshard import has_per_rank, share_of_rank, split_key


@dataclass(frozen=True)
class Conversions:
    """How a framework's tensors are copied and moved for checkpoints.

    ``is_tensor(v)``; ``copy(v, like)``: a copy on ``like``'s device (None: ``v``'s);
    ``host(v)``: a copy on the host, picklable; ``to_numpy(v)``: a host array (a dtype numpy lacks, as float32);
    ``from_numpy(a, like, dtype)``: a tensor of ``dtype`` on ``like``'s device; ``dtype(v)``.
    """

    is_tensor: Callable[[Any], bool]
    copy: Callable[[Any, Any], Any]
    host: Callable[[Any], Any]
    to_numpy: Callable[[Any], np.ndarray]
    from_numpy: Callable[[np.ndarray, Any, Any], Any]
    dtype: Callable[[Any], Any]


def copied(tensors: Mapping[str, Mapping], copy: Callable[[Any], Any], is_tensor: Callable[[Any], bool]) -> dict:
    """name -> {key: copy(tensor) or the value as it is}."""
    return {name: {k: copy(v) if is_tensor(v) else v for k, v in st.items()} for name, st in tensors.items()}


def cloned(tensors: Mapping[str, Mapping], conv: Conversions) -> dict:
    """A copy of per-tensor states, each tensor on its own device."""
    return copied(tensors, lambda v: conv.copy(v, None), conv.is_tensor)


def save(driver: Any, conv: Conversions, gather: bool, like: Any) -> dict:
    """The ``'hvdcompress'`` entry of a checkpoint from ``driver`` (:class:`hvdcompress.step.driver.StepDriver`):
    one rank's state, or with ``gather`` every rank's (a collective over the driver's ranks;
    ``like``: a tensor on the device the bytes travel from)."""
    own = {"compressor": driver.compressor.state_dict(), "world": driver.comm.world,
           "average": driver.options.average}
    tensors = driver.states.named()
    if gather:
        own["ranks"] = allgather_object(copied(tensors, conv.host, conv.is_tensor), driver.comm, driver.ops, like)
    else:
        own["tensors"] = cloned(tensors, conv)
    return own


def load(driver: Any, own: Mapping, conv: Conversions, known: Iterable[str],
         layout: Callable[[str], tuple], who: str = "load_state_dict") -> None:
    """Load :func:`save`'s output into ``driver``'s states. ``known``: the tensor names this
    front end keeps state under (anything else is refused); ``layout(name)`` ->
    ``(numel, like, alltoall)``: the tensor's size, a tensor on its device, and a callable
    telling whether the engine runs it as a compressed allreduce (asked only for a gathered
    checkpoint with state). Local: no collective."""
    saved = own["tensors"] if "tensors" in own else {n: {} for r in own["ranks"] for n in r}
    unknown = sorted(set(saved) - set(known))
    if unknown:
        raise ValueError(f"{who}: compressor state for tensors this front end does not exchange: "
                         f"{unknown[:5]} (names must be the same as when it was saved)")
    world, rank = driver.comm.world, driver.comm.rank
    if "ranks" not in own and own.get("world", world) != world and any(has_per_rank(st) for st in saved.values()):
        raise ValueError(f"{who}: this checkpoint holds one rank's compressor state (residuals, "
                         f"momenta) of a run at {own['world']} ranks, and this run has {world}; save "
                         "it with state_dict(gather=True) to resume at another world size, or drop "
                         "its 'hvdcompress' state to start the compressor afresh")
    driver.compressor.load_state_dict(own["compressor"])
    if "ranks" not in own:
        for name, st in saved.items():
            like = layout(name)[1]
            driver.states[name] = {k: conv.copy(v, like) if conv.is_tensor(v) else v for k, v in st.items()}
        return
    for name in sorted(saved):
        numel, like, alltoall = layout(name)
        per_rank = [r.get(name, {}) for r in own["ranks"]]
        dtypes = {split_key(k)[2]: conv.dtype(v) for st in per_rank for k, v in st.items() if conv.is_tensor(v)}
        states = [{k: conv.to_numpy(v) if conv.is_tensor(v) else v for k, v in st.items()} for st in per_rank]
        new = share_of_rank(states, numel, world, rank, driver.options.average, own.get("average"),
                            alltoall, who)
        driver.states[name] = {k: conv.from_numpy(v, like, dtypes[split_key(k)[2]])
                               if isinstance(v, np.ndarray) else v for k, v in new.items()}

