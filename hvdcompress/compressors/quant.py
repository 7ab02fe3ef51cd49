"""What the table quantisers share: decoding through a per-rank table.

A :class:`TableQuantizer` sends ``[codes (uint8, packed bits-wide), scale (float32, 1)]`` and is
allgathered; the value of code c from a rank with scale s is ``s * unit_table()[c]``, so all
ranks' payloads decode and sum in one :meth:`~hvdcompress.ops.facade.Ops.unpack_sum`. Gradients of
other float dtypes are quantised as float32 and returned in their own dtype.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Optional, Tuple

import numpy as np

from ..contract.compressor import Compressor, Packet, TensorInfo, decode_into
from ..ops.facade import Ops, Tensor
from ..ops.layout import packed_bytes
from .payload import as_float32, check_payload


class TableQuantizer(Compressor):
    """Base of the table-decoded quantisers. Subclasses give :attr:`bits`, :meth:`unit_table`
    and :meth:`encode`."""

    bits = 8
    supports_alltoall = True
    fixed_size_payload = True

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
        check_payload(ops, self.name, "scales", scales, "float32", world * self.scales_per_rank(info))
        return tensors

    def scales_per_rank(self, info: TensorInfo) -> int:
        """The float32 scales in one rank's payload (one; more for per-run scales)."""
        return 1

