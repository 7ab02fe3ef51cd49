"""Helpers for building and checking payloads, shared by compressors of every kind: float32
input, a one-element float32 tensor (a scale), and dtype/length checks of received payloads."""
from __future__ import annotations

from typing import Tuple

import numpy as np

from ..contract.compressor import TensorInfo, check_float_tensor
from ..ops.facade import Ops, Tensor


def as_float32(ops: Ops, x: Tensor, info: TensorInfo) -> Tuple[Tensor, str]:
    """``x`` as float32 and its original dtype (a TypeError for non-float gradients)."""
    check_float_tensor(ops, x, info)
    dtype = ops.dtype(x)
    return (x if dtype == "float32" else ops.cast(x, "float32")), dtype


def check_payload(ops: Ops, owner: str, what: str, t: Tensor, dtype: str, expected: int) -> None:
    """A ValueError (TypeError for the dtype) unless ``t`` is ``expected`` elements of ``dtype``."""
    if ops.dtype(t) != dtype:
        raise TypeError(f"{owner}: payload {what} has dtype {ops.dtype(t)}; expected {dtype}")
    if ops.numel(t) != expected:
        raise ValueError(f"{owner}: payload {what} has {ops.numel(t)} elements; expected {expected} "
                         "(corrupt payload, or ranks configured differently)")


def constant(ops: Ops, value: float, like: Tensor) -> Tensor:
    """A one-element float32 tensor holding ``value``, on ``like``'s device."""
    return ops.from_numpy(np.full(1, value, dtype=np.float32), like)
