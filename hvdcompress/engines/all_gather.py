"""The quantised parameter all-gather of sharded training (ZeRO++'s qwZ), framework-agnostic.

Under FULL_SHARD each step all-gathers every unit's parameters twice (forward, backward) and
reduce-scatters its gradient once, so the parameters are two thirds of the traffic. Rule: each
rank quantises its own flat shard ``w_r`` (n elements) with min-max codes per chunk of ``chunk``
elements, the codes and every chunk's (min, max) are all-gathered, and every rank decodes every
rank's shard into the unsharded buffer::

    w~_r[i] = min_c + code_i · (max_c − min_c)/(2^bits − 1),   code_i = rint((w_r[i] − min_c) · (2^bits − 1)/(max_c − min_c))

Maths: each element of a gathered parameter is off by at most half a step, ``(max_c − min_c)/510``
for int8 (``/30`` for int4), of its chunk c, per gather. The master weights (the sharded parameter
the optimizer updates) stay exact and each gather quantises them afresh, so the error does not
accumulate over steps: the forward and backward run at ``w + e`` with ``|e|`` bounded as above and
the gradient's update lands on the exact ``w``. Every rank decodes the same payloads, so the
unsharded parameters are identical on every rank, this rank's own shard included.

Bytes this rank sends per gather (its contribution once, as :class:`~.accounting.ByteCount`
counts): ``packed_bytes(n, bits) + 8·ceil(n/chunk)`` against FSDP's own ``n·s`` (``s`` the bytes per
element of the all-gather dtype: 4 for float32, so int8 sends ≈ 1/4 plus 0.4% of bounds at
``chunk=2048``; 2 under a bfloat16 ``param_dtype``, so 2x fewer only).

Allowed: the deterministic min-max quantisers :class:`~hvdcompress.compressors.int8.Int8` and
:class:`~hvdcompress.compressors.int8.Int4` (any ``chunk``; ``{"compressor": "int8"}``). The
forward and the backward gathers must yield the same weights (autograd's saved activations come
from the forward's), which rules out the stochastic quantisers; a payload whose size depends on
the values (sparsifiers) cannot fill FSDP's fixed-size buffer, and error feedback has no meaning
for weights that are quantised afresh from the exact ones at every gather.

Trade-off: 4x fewer parameter bytes (int8 at float32) for an encode of n and a decode of P·n
elements per gather on every rank, and a bounded perturbation of the weights the model sees. A
chunk spans the flat shard of a unit, so a layer's weights and its bias may share one chunk:
an outlier widens the step for its whole chunk (smaller ``chunk``: tighter, 8 bytes each).
"""
from __future__ import annotations

from ..compressors.int8 import Int4, Int8
from ..contract.compressor import Compressor, TensorInfo
from ..ops.facade import Ops, Tensor
from ..ops.layout import packed_bytes

GATHERABLE = (Int8, Int4)


def check_gatherable(compressor: Compressor) -> Int8:
    """``compressor`` if the parameter all-gather can run it, else a ValueError naming what can."""
    if type(compressor) not in GATHERABLE:
        raise ValueError(f"all_gather={compressor!r}: the quantised parameter all-gather takes the "
                         "deterministic min-max quantisers only, Int8(chunk=...) or Int4(chunk=...) (or "
                         "{'compressor': 'int8'}): the forward and backward gathers must give the same "
                         "weights, FSDP's buffer has a fixed size, and weights take no error feedback")
    return compressor


class ParameterCodec:
    """One quantiser's encode of a rank's flat shard and decode of any rank's payload (module doc)."""

    def __init__(self, compressor: Int8, ops: Ops):
        self.compressor = check_gatherable(compressor)
        self.ops = ops

    def payload_bytes(self, numel: int) -> int:
        """Bytes one rank's payload of a ``numel``-element shard occupies: codes, then bounds."""
        return packed_bytes(numel, self.compressor.bits) + 8 * -(-numel // self.compressor.chunk)

    def encode(self, shard: Tensor, name: str) -> list:
        """``[codes, bounds]`` of ``shard`` (any float dtype, quantised in float32)."""
        return self.compressor.compress(self.ops, shard, {}, self._info(name, self.ops.numel(shard))).tensors

    def decode(self, codes: Tensor, bounds: Tensor, name: str, out: Tensor) -> Tensor:
        """One rank's shard decoded from its ``codes`` and ``bounds`` into ``out`` (its dtype)."""
        numel = self.ops.numel(out)
        return self.compressor.decompress(self.ops, [codes, bounds], self.ops.dtype(out), self._info(name, numel), out)

    @staticmethod
    def _info(name: str, numel: int) -> TensorInfo:
        return TensorInfo(name=name, numel=numel, world=1, rank=0, shape=(numel,))
