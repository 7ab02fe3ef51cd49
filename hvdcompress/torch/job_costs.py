"""What a tensor costs a training job beside its codec time and its bytes: the front end's work.

Every gradient passes through the front end's Python in every step: Horovod's hook enqueues it
and negotiates it; hvdcompress's hook also compresses it (state, error feedback, the packet),
the engine launches its collectives, ``synchronize`` waits for them, decodes and writes the
result back. On a model of many small tensors this is much of the step: the 98 tensors of the
benchmarks' ``deep`` model (3.6M parameters, 20 ms of compute) cost onebit+EF 0.5 ms each per
step on this project's 2-core CPU, where its calibrated codec takes 0.15 ms.

Measured in a job (:func:`measure`, on every rank of a ``horovodrun``; the benchmarks launch it
beside their Horovod probe): ``tensors`` parameters of ``shape`` (16 x 16: a matrix that
PowerSGD compresses, as it does a model's weights; DGC and CSC send it dense, as they do every
tensor under 16,384 elements), per step
``zero_grad``, a backward and the optimizer's step, the median of ``steps`` steps after a
warm-up, every rank starting together. Per compressor spec:

* ``per_tensor`` = (median step with K tensors − with one) / (K − 1) − the calibrated codec
  time at the shape's elements (which the model adds by itself), at least 0;
* ``per_member`` (fusable compressors): the same with ``fusion=True`` (one bucket of the K): what
  each further member of a fused bucket costs (its hook, its copy in and out of the bucket).

``none`` and ``fp16`` are Horovod's own optimizer (without and with ``hvd.Compression.fp16``), the
references of the speed-ups; the others hvdcompress's torch optimizer. Trade-off: tiny tensors
in a loop keep the caches warm, which a real backward does not (there Horovod's own hook took
3x longer per tensor): the term is a floor.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Mapping, Optional

from ..plan.calibration import Calibration
from ..plan.front_ends import native
from ..plan.payloads import spec_key

TENSORS, SHAPE, STEPS, WARMUP = 97, (16, 16), 30, 5


def _median_step(make: Callable[[Any, list], Any], tensors: int, shape: tuple, steps: int) -> float:
    import horovod.torch as hvd
    import torch

    params = [torch.nn.Parameter(torch.randn(shape)) for _ in range(tensors)]
    optimizer = make(torch.optim.SGD(params, lr=0.0), [(f"p{i:04d}", p) for i, p in enumerate(params)])
    times = []
    for _ in range(WARMUP + steps):
        hvd.barrier()
        begin = time.perf_counter()
        optimizer.zero_grad()
        sum((p * p).sum() for p in params).backward()
        optimizer.step()
        times.append(time.perf_counter() - begin)
    return statistics.median(times[WARMUP:])


def _optimizer(spec: Mapping[str, str], fusion: bool) -> Callable[[Any, list], Any]:
    import horovod.torch as hvd

    from .. import torch as hvdc

    if native(spec):   # Horovod's own: the speed-ups' references
        compression = hvd.Compression.fp16 if spec["compressor"] == "fp16" else hvd.Compression.none
        return lambda opt, named: hvd.DistributedOptimizer(opt, named_parameters=named, compression=compression)
    return lambda opt, named: hvdc.DistributedOptimizer(opt, named_parameters=named, compression=dict(spec),
                                                       fusion=fusion)


def measure(specs: Mapping[str, Mapping[str, str]], calibration: Optional[Calibration] = None,
            tensors: int = TENSORS, shape: tuple = SHAPE, steps: int = STEPS) -> dict:
    """``{"per_tensor": {spec key: s}, "per_member": {spec key: s}}`` for ``specs`` (labels to
    specs), on every rank of an initialised Horovod job (see the module doc); ``calibration``:
    the codec times to take out (None: none taken out)."""
    import horovod.torch as hvd

    from ..registry import from_params

    if tensors < 2:
        raise ValueError(f"measure: tensors={tensors} must be at least 2 (a slope between 1 and K)")
    def slope(spec: Mapping[str, str], fusion: bool) -> float:
        one = _median_step(_optimizer(spec, fusion), 1, shape, steps)
        return (_median_step(_optimizer(spec, fusion), tensors, shape, steps) - one) / (tensors - 1)

    per_tensor, per_member, elements = {}, {}, math.prod(shape)
    for spec in specs.values():
        key = spec_key(spec)
        times = calibration.times(spec) if calibration is not None else None
        codec = 0.0 if times is None else times.compress_s(elements) + times.decode_s(elements, hvd.size())
        per_tensor[key] = max(slope(spec, False) - codec, 0.0)
        if not native(spec) and from_params(dict(spec)).fusable:
            per_member[key] = max(slope(spec, True), 0.0)
    return {"per_tensor": per_tensor, "per_member": per_member}
