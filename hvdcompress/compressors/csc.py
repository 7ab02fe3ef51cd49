"""CSC: coarse-grained sparsification with chunks chosen by allreduced norms.

Per tensor and step, with local gradient ``g``, momentum ``m``, ``N`` ranks, a flat tensor of
``n`` elements cut into ``C = ⌈n / chunk⌉`` chunks ``B_1 … B_C`` of ``chunk`` elements (the last
one shorter)::

    u, v ← DGC's momentum correction of g       (weight decay, clipping, plain or Nesterov;
                                                 v is the accumulated, not yet sent gradient)
    round 0:  s_c = Σ_{i∈B_c} |v_i|             C floats, allreduced: S_c = Σ_ranks s_c
    K = ⌈ratio · C⌉;   J = the K chunks of largest S_c, ties to the lower chunk index
    round 1:  send v_I, I = ∪_{c∈J} B_c         K·chunk floats (fewer if J holds the last
                                                 chunk), allreduced: Σ_ranks v_I
    v_I ← 0;   u_I ← 0 (masking=True)           the rest of v stays as the residual
    result:   Σ_ranks v_I scattered into zeros at I (the wrapper divides by N)

Every rank sees the same ``S`` (one allreduce result) and breaks ties the same way, so every
rank picks the same ``J`` and round 1 is a plain sum of equally long vectors: no indices travel
and nothing is allgathered. NaN counts as +inf in ``|v_i|``, so a chunk holding a non-finite
value is chosen first and reaches every rank, as with a dense allreduce. At ``ratio = 1`` (and
for tensors below ``min_numel`` elements) the tensor is sent dense in one round, exactly DGC's
dense path: momentum SGD on the averaged gradient. Like DGC, CSC takes over the wrapped SGD's
momentum, Nesterov flag and weight decay (``takes_over_momentum``); values travel in the
gradient's dtype, norms in float32.

Bytes per rank (ring allreduce, float32): ``2(N−1)/N · 4·(C + K·chunk) ≈ 8n·(1/chunk + ratio)``
against ``8n`` dense, flat in ``N``; top-k or DGC with allgather send ``(N−1)·8·k``, which grows
with ``N``. The trade-off: an extra round of ``C`` floats per tensor whose cost is mostly latency
(``2(N−1)`` ring steps), and a coarser selection: a whole chunk is sent for one large element,
so at the same bytes fewer of the largest elements go out than with element-wise top-k.

Defaults: ``ratio=0.01`` of the chunks kept; ``chunk=1024`` elements, so the norms add
``1/1024 ≈ 0.1%`` of the dense size, a tenth of what the values cost at ``ratio=0.01``, while a
chunk is still a small part of a weight matrix; ``min_numel=16384`` (16 chunks) as DGC.
``warmup`` as DGC's: the schedules ramp the sparsity ``1 − ratio``, e.g.
``ExponentialWarmup(L)`` keeps the fraction ``ratio ** ((t + 1) / L)`` of the chunks at step or
epoch ``t < L``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ..contract.compressor import Packet, TensorInfo
from ..contract.schedule import Schedule
from ..contract.validation import check_int, check_range
from ..ops.facade import Ops, Tensor
from .density import resolve_k
from .dgc import MomentumCorrection
from .payload import check_payload


@dataclass
class _Chosen:
    """What decompression of round 1 needs (stays on the rank)."""

    indices: Tensor
    dtype: str


class CSC(MomentumCorrection):
    """Coarse-grained sparsification: ``ratio`` is the fraction of ``chunk``-element chunks sent
    (by largest L1 norm summed over ranks); momentum correction, masking (off by default),
    clipping, weight decay, warm-up and small-tensor handling as :class:`~hvdcompress.DGC`."""

    name = "csc"

    def __init__(self, ratio: float = 0.01, chunk: int = 1024, momentum: Optional[float] = None,
                 nesterov: Optional[bool] = None, masking: bool = False,
                 clip_norm: Optional[float] = None, weight_decay: Optional[float] = None,
                 min_numel: int = 16384, warmup: Optional[Schedule] = None):
        own = "CSC"
        self.ratio = check_range(own, "ratio", ratio, 0.0, 1.0, low_open=True)
        self.chunk = check_int(own, "chunk", chunk, 1)
        super().__init__(own, momentum, nesterov, masking, clip_norm, weight_decay, min_numel, warmup)

    @property
    def target_sparsity(self) -> float:
        return 1.0 - self.ratio

    def chunk_norms(self, ops: Ops, v: Tensor, nchunks: int) -> Tensor:
        """The float32 L1 norm of each ``chunk``-element chunk of ``v`` (NaN as +inf), one
        matrix-vector product of the zero-padded magnitudes with a vector of ones."""
        v32 = v if ops.dtype(v) == "float32" else ops.cast(v, "float32")
        mag = ops.magnitude(v32)
        pad = nchunks * self.chunk - ops.numel(v)
        if pad:
            mag = ops.concat([mag, ops.zeros(pad, like=mag)])
        ones = ops.reshape(ops.zeros(self.chunk, like=mag) + 1.0, (self.chunk, 1))
        return ops.reshape(ops.matmul(ops.reshape(mag, (nchunks, self.chunk)), ones), (nchunks,))

    def positions(self, ops: Ops, chosen: Tensor, nchunks: int, n: int, like: Tensor) -> Tensor:
        """Int64 element positions of the chunks ``chosen`` (ascending chunk indices):
        ``chosen[j] * chunk + i`` for ``i < chunk``, K·chunk of them whichever chunks were chosen,
        so the payload's size never depends on the choice and nothing is read on the host. Built
        from the ``K`` starts, not from a pass over the tensor. The positions past ``n`` (only in
        the last, shorter chunk) are kept: :meth:`padded` reads zeros there."""
        k = ops.numel(chosen)
        offsets = ops.reshape(ops.from_numpy(np.arange(self.chunk, dtype=np.int64), like), (1, self.chunk))
        starts = ops.reshape(ops.cast(chosen, "int64") * self.chunk, (k, 1))
        return ops.reshape(starts + offsets, (k * self.chunk,))  # broadcast: (k, 1) + (1, chunk)

    def padded(self, ops: Ops, x: Tensor, nchunks: int, n: int) -> Tensor:
        """``x`` followed by zeros up to ``nchunks * chunk`` elements."""
        pad = nchunks * self.chunk - n
        return ops.concat([x, ops.zeros(pad, like=x)]) if pad else x

    def in_range(self, ops: Ops, positions: Tensor, nchunks: int, n: int) -> Tensor:
        """``positions`` with those past the end moved to ``n - 1`` (they carry zeros: adding them
        there, or clearing ``n - 1`` with the rest of the last chunk, changes nothing), on the
        device: p - [p >= n] · (p - n + 1)."""
        if nchunks * self.chunk == n:
            return positions
        past = ops.cast(positions >= n, "int64")
        return positions - past * (positions - (n - 1))

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        corrected = self.correct(ops, x, state, info)
        if isinstance(corrected, Packet):
            return corrected
        u, v = corrected
        n = info.numel
        nchunks = -(-n // self.chunk)
        k = resolve_k(1.0 - self.current_sparsity, nchunks)

        def second_round(outputs: list) -> Packet:
            check_payload(ops, self.name, "chunk norms", outputs[0], "float32", nchunks)
            _, chosen = ops.topk_abs(outputs[0], k)  # norms are >= 0; ties to the lower index
            found = self.positions(ops, chosen, nchunks, n, v)
            values = ops.gather(self.padded(ops, v, nchunks, n), found)
            indices = self.in_range(ops, found, nchunks, n)
            self.release(ops, state, u, v, indices)
            return Packet([values], _Chosen(indices, ops.dtype(v)), summable=True)

        return Packet([self.chunk_norms(ops, v, nchunks)], None, summable=True, resume=second_round)

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        if not isinstance(ctx, _Chosen):  # sent dense
            return ops.into(out, tensors[0])
        check_payload(ops, self.name, "chunk values", tensors[0], ctx.dtype, ops.numel(ctx.indices))
        return super().decompress(ops, [tensors[0], ctx.indices], None, info, out)
