"""What the quantisers share: float32 input, reproducible random keys, payload checks, a
compressor-owned residual, and decoding through a per-rank table.

A :class:`TableQuantizer` sends ``[codes (uint8, packed bits-wide), scale (float32, 1)]`` and is
allgathered; the value of code c from a rank with scale s is ``s * unit_table()[c]``, so all
ranks' payloads decode and sum in one :meth:`~hvdcompress.backend.Ops.unpack_sum`. Gradients of
other float dtypes are quantised as float32 and returned in their own dtype.
"""
from __future__ import annotations

import zlib
from abc import abstractmethod
from typing import Any, Optional, Tuple

import numpy as np

from ..backend import Ops, Tensor
from ..compressor import Compressor, Packet, TensorInfo, check_float_tensor, decode_into
from ..ops.layout import packed_bytes

RESIDUAL = "quant_residual"


def as_float32(ops: Ops, x: Tensor, info: TensorInfo) -> Tuple[Tensor, str]:
    """``x`` as float32 and its original dtype (a TypeError for non-float gradients)."""
    check_float_tensor(ops, x, info)
    dtype = ops.dtype(x)
    return (x if dtype == "float32" else ops.cast(x, "float32")), dtype


def next_key(seed: int, state: dict, info: TensorInfo) -> int:
    """A 32-bit key for this tensor's stochastic rounding at this step (advances the step).

    Each rank's key differs (xor with the rank times an odd constant), so the rounding errors of
    different ranks are independent and the average's variance falls as 1/N.
    """
    step = int(state.get("step", 0))
    state["step"] = step + 1
    return zlib.crc32(f"{seed}:{step}:{info.name}".encode()) ^ ((info.rank * 0x9E3779B1) & 0xFFFFFFFF)


def check_payload(ops: Ops, owner: str, what: str, t: Tensor, dtype: str, expected: int) -> None:
    """A ValueError (TypeError for the dtype) unless ``t`` is ``expected`` elements of ``dtype``."""
    if ops.dtype(t) != dtype:
        raise TypeError(f"{owner}: payload {what} has dtype {ops.dtype(t)}; expected {dtype}")
    if ops.numel(t) != expected:
        raise ValueError(f"{owner}: payload {what} has {ops.numel(t)} elements; expected {expected} "
                         "(corrupt payload, or ranks configured differently)")


def constant(ops: Ops, value: float, like: Tensor) -> Tensor:
    return ops.from_numpy(np.full(1, value, dtype=np.float32), like)


class OwnResidual:
    """Mixin: the compressor keeps its own error-feedback residual (state ``quant_residual``),
    updated inside its kernel. Wrapping it in ErrorFeedback would count the error twice, so that
    is refused with a clear error."""

    keeps_residual = True

    def init_state(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> None:
        if RESIDUAL not in state:
            ops.write(state, RESIDUAL, ops.zeros(info.numel, like=x, dtype="float32"))

    def residual(self, state: dict) -> Tensor:
        if "residual" in state:
            raise ValueError(f"{type(self).__name__} keeps its own error-feedback residual; do not "
                             "wrap it in ErrorFeedback (use ef='none')")
        return state[RESIDUAL]


class TableQuantizer(Compressor):
    """Base of the table-decoded quantisers. Subclasses give :attr:`bits`, :meth:`unit_table`
    and :meth:`encode`."""

    bits = 8
    supports_alltoall = True

    @abstractmethod
    def unit_table(self) -> np.ndarray:
        """float32[2**bits]: the value of each code for a scale of 1."""

    @abstractmethod
    def encode(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Tuple[Tensor, Tensor]:
        """``(codes, scale)`` for the float32 gradient ``x``."""

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        x32, dtype = as_float32(ops, x, info)
        codes, scale = self.encode(ops, x32, state, info)
        return Packet([codes, scale], dtype, summable=False)

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        return self.decompress_gathered(ops, tensors, ctx, info, 1, out)

    def decompress_gathered(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                            world: int, out: Optional[Tensor] = None) -> Tensor:
        codes, scales = self.checked(ops, tensors, info, world)
        tables = ops.outer(scales, ops.from_numpy(self.unit_table(), like=scales))
        return decode_into(ops, out, ctx, lambda buf: ops.unpack_sum(codes, info.numel, self.bits, tables, out=buf))

    def checked(self, ops: Ops, tensors: list, info: TensorInfo, world: int) -> list:
        """``[codes, scales]`` of ``world`` payloads, their lengths checked."""
        if len(tensors) != 2:
            raise ValueError(f"{self.name}: expected 2 payload tensors (codes, scales), got {len(tensors)}")
        codes, scales = tensors
        per_rank = packed_bytes(info.numel, self.bits)
        check_payload(ops, self.name, "codes", codes, "uint8", world * per_rank)
        check_payload(ops, self.name, "scales", scales, "float32", world)
        return tensors

