"""The inputs of ``compression="auto"`` that come from the machine: the link, measured over the
process set, and the codec calibration; then rank 0's, handed to every rank.

**The link** is fitted from timed ring allreduces through the engine's own
:class:`~hvdcompress.transport.collectives.Collectives` (the best of :data:`REPEATS` after one untimed call,
which pays Horovod's negotiation and buffer set-up): a tiny buffer gives the latency, a large
one the bandwidth::

    t_small = 2(P-1)·alpha                       ->  alpha = t_small / (2(P-1))
    t_large = 2(P-1)·alpha + 2(P-1)/P · B/beta   ->  beta  = 2(P-1)/P · B / (t_large - t_small)

Trade-off: :data:`LARGE` (1 MiB) keeps the probe under a second down to ~100 Mbit/s at the
price of missing TCP's slow start and fusion-sized messages; the fit is of this process set's
allreduce, which is what the flat exchange runs.

**The calibration** (``"machine"``): this machine's cache
(:func:`hvdcompress.plan.calibration.cache_path`), with the allowed compressors it lacks
calibrated now (a few seconds) and merged into it. It times the torch kernels of the plan's
device, or, in a TensorFlow process, the front end's own ops (:func:`engine_device`).

**Identical inputs.** Every rank measures (the allreduces need them all), but only rank 0's link,
calibration and Horovod fusion settings are used, sent to every rank (:func:`from_rank0`).
"""
from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any, Iterable, Mapping, Optional

import numpy as np

from ..ops.facade import Ops, Tensor
from ..plan import calibration as cal
from ..plan.device import Device, torch_device
from ..plan.links import Link
from ..transport.collectives import Collectives, wire_bytes
from ..transport.objects import allgather_object

SMALL, LARGE = 1, 1 << 18   # float32 elements of the probes: 4 bytes and 1 MiB
REPEATS = 3


def _allreduce_seconds(comm: Collectives, ops: Ops, like: Tensor, numel: int) -> float:
    """The best of :data:`REPEATS` timed allreduces of ``numel`` float32 zeros."""
    buffer = ops.zeros(numel, like=like, dtype="float32")
    tag = f"hvdc.auto.probe{numel}"
    comm.wait(comm.allreduce([buffer], tag))
    best = math.inf
    for _ in range(REPEATS):
        begin = time.perf_counter()
        comm.wait(comm.allreduce([buffer], tag))
        best = min(best, time.perf_counter() - begin)
    return best


def on_gpu(like: Tensor) -> bool:
    """Whether ``like`` (a torch or TF tensor) lives on a GPU."""
    where = str(getattr(like, "device", "")).lower()
    return "gpu" in where or "cuda" in where


def measure_link(comm: Collectives, ops: Ops, like: Tensor) -> Link:
    """Alpha and beta of the ring allreduce over ``comm``'s process set (see the module doc),
    and whether its pairwise exchanges take turns (Gloo, :meth:`Collectives.pairs_take_turns`);
    a free link on one rank."""
    ranks = comm.world
    if ranks <= 1:
        return Link(0.0, math.inf)
    small = _allreduce_seconds(comm, ops, like, SMALL)
    large = _allreduce_seconds(comm, ops, like, LARGE)
    transfer = max(large - small, 1e-9)
    return Link(small / (2 * (ranks - 1)), wire_bytes("allreduce", 4 * LARGE, ranks) / transfer,
                half_duplex_pairs=comm.pairs_take_turns(on_gpu(like)))


def engine_device(ops: Ops, like: Tensor) -> Device:
    """The device payloads and codecs are measured on: the plan's torch device for the torch
    front end (the cache of ``python -m hvdcompress.plan --calibrate``), else the front end's own
    ops on the gradients' device, named ``<framework>-<cpu|cuda>`` (a TensorFlow process must not
    import hvdcompress.torch: horovod.torch would take over Horovod's process sets)."""
    framework = ops.name   # the Ops implementation's framework: 'torch', 'tensorflow'
    if framework == "torch":
        return torch_device()
    sample = ops.zeros(1, like=like, dtype="float32")
    rng = np.random.default_rng(0)

    def randn(numel: int, shape: tuple) -> Tensor:
        return ops.from_numpy(rng.standard_normal(numel).astype(np.float32), sample)

    kind = "cuda" if on_gpu(sample) else "cpu"
    return Device(f"{framework}-{kind}", ops, randn, lambda: None)


def machine_calibration(specs: Iterable[Mapping[str, Any]], device: Device) -> cal.Calibration:
    """This machine's cached calibration on ``device``, with the ``specs`` it lacks calibrated
    and cached."""
    path = cal.cache_path(device.name)
    cached = cal.load(path)
    missing = [s for s in specs if cached is None or cached.times(s) is None]
    if not missing:
        return cached
    fresh = cal.calibrate(missing, device=device)
    merged = replace(fresh, codecs={**(cached.codecs if cached else {}), **fresh.codecs})
    cal.save(merged, path)
    return merged


def from_rank0(value: Optional[Any], comm: Collectives, ops: Ops, like: Tensor) -> Any:
    """Rank 0's ``value`` on every rank (one allgather of the pickled objects; the other ranks
    send None)."""
    if comm.world <= 1:
        return value
    return allgather_object(value if comm.rank == 0 else None, comm, ops, like)[0]
