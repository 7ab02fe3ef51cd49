"""Payload bytes per compressor, measured from the real compressors.

A compressor is given as a spec for :func:`hvdcompress.from_params` (a dict of strings, e.g.
``{"compressor": "topk", "k": "0.01", "ef": "vanilla"}``). :func:`measure` compresses a random
tensor of the given shape once, the way the exchange engine does, and follows every round of
a multi-round algorithm (PowerSGD's P then Q, CSC's chunk norms then chunks; a later round's
input is this rank's own payload, which has the shape of the sum): the bytes of each round's
payload and whether the payloads are summed (allreduce) or per rank (allgather / compressed
allreduce). Sizes depend only on the tensor's shape and the configuration (the engine relies on
it: every rank must launch the same collectives), so one measurement per shape is memoised.

Trade-off: measuring is exact (per-chunk scales, index widths, DGC's dense small tensors,
PowerSGD's 1-D tensors sent dense) where ratios would drift from the code, at the price of one
compression per distinct shape (a second or two for a 100M-element embedding on a CPU).
"""
from __future__ import annotations

import functools
import json
from typing import Mapping, NamedTuple, Optional

from ..contract.compressor import TensorInfo, payload_bytes
from ..registry import from_params
from .device import Device, torch_device

#: The default compressors the plan compares: label -> spec for :func:`hvdcompress.from_params`.
DEFAULT_COMPRESSORS: dict = {
    "none": {"compressor": "none"},
    "fp16": {"compressor": "fp16"},
    "int8": {"compressor": "int8"},
    "onebit+ef": {"compressor": "onebit", "ef": "vanilla"},
    "dgc 0.999": {"compressor": "dgc", "sparsity": "0.999"},
    "csc 1%": {"compressor": "csc", "ratio": "0.01"},
    "powersgd r4": {"compressor": "powersgd", "rank": "4"},
    "topk 1%": {"compressor": "topk", "k": "0.01", "ef": "vanilla"},
}
DENSE, FP16 = "none", "fp16"   # the references of the speed-ups (Horovod without / with fp16)


class Payload(NamedTuple):
    """One rank's payload bytes of each round for one tensor, whether they are summed, and each
    round's bytes by dtype (``((dtype, bytes), ...)`` per round: the reduction's cost per byte
    depends on the dtype, see :meth:`hvdcompress.plan.calibration.Calibration.reduce_s`)."""

    rounds: tuple
    summable: bool
    dtypes: tuple = ()

    @property
    def total(self) -> int:
        return sum(self.rounds)


def spec_key(spec: Mapping[str, str]) -> str:
    """A canonical text of a spec (sorted keys): the key of memos and of calibration files."""
    return json.dumps({k: str(v) for k, v in spec.items()}, sort_keys=True)


def shard_shape(shape: tuple, numel: int, parts: int) -> tuple:
    """The shape of the shard a rank owns in the two-level exchange's cross-node level
    (:mod:`hvdcompress.engines.two_level`): a matrix whose rows ``parts`` divides keeps its shape for
    its shard of rows (so PowerSGD still compresses it), anything else is a flat segment of
    ⌈numel/parts⌉ (as every segment of the compressed allreduce is)."""
    rows = shape[0] if len(shape) >= 2 else 0
    if parts > 1 and rows and rows % parts == 0:
        return (rows // parts, *shape[1:])
    return (-(-numel // parts),)


def measure(spec: Mapping[str, str], shape: tuple, device: Optional[Device] = None) -> Payload:
    """The payload of ``spec``'s compressor for one tensor of ``shape`` (memoised), measured on
    ``device`` (default :func:`torch_device`; a TensorFlow process must not import
    horovod.torch, see :func:`hvdcompress.auto.probe.engine_device`)."""
    return _measure(spec_key(spec), tuple(int(s) for s in shape), device)


@functools.lru_cache(maxsize=None)
def _measure(key: str, shape: tuple, device: Optional[Device]) -> Payload:
    device = device or torch_device()
    numel = 1
    for size in shape:
        numel *= size
    compressor = from_params(json.loads(key))
    x = device.randn(numel, shape)
    info = TensorInfo(name="plan", numel=numel, shape=shape, param=device.ops.zeros(numel, like=x))
    state: dict = {}
    compressor.init_state(device.ops, x, state, info)
    packet = compressor.compress(device.ops, x, state, info)
    summable, rounds = packet.summable, [_by_dtype(device.ops, packet.tensors)]
    while packet.resume is not None:
        packet = packet.resume(packet.tensors)
        rounds.append(_by_dtype(device.ops, packet.tensors))
    return Payload(tuple(sum(b for _, b in r) for r in rounds), summable, tuple(rounds))


def _by_dtype(ops, tensors: list) -> tuple:
    """A round's payload bytes by dtype, ``((dtype, bytes), ...)`` in order of first use."""
    out: dict = {}
    for t in tensors:
        out[ops.dtype(t)] = out.get(ops.dtype(t), 0) + payload_bytes(ops, [t])
    return tuple(out.items())


def supports_alltoall(spec: Mapping[str, str]) -> bool:
    """Whether the compressed allreduce may carry this compressor's payloads."""
    return from_params(spec).supports_alltoall
