"""The segment codec: one tensor's P segments through one all-to-all, and the sum of this rank's.

Both halves of a compressed reduce (the compressed allreduce of :mod:`.exchange`, the sharded
reduce-scatter of :mod:`.reduce_scatter`) cut a flat gradient into P segments, one per rank,
compress each (a segment may be cut again into blocks, each compressed with its own state),
and send segment j to rank j in one all-to-all; rank r decodes its segment as sent by every
rank and sums it in float32::

    tensors[k] = concat over segments j, then blocks b, of packet(j, b).tensors[k]   (sent)
    segment_r  = concat over blocks b of Σ_q D(C(x_q[r, b]))                           (received)

The all-to-all's parts must be equal on every rank, so every compressor that runs here has a
payload whose size the block's length fixes (``fixed_size_payload``).
"""
from __future__ import annotations

from typing import Any, Sequence

from ..contract.compressor import Compressor
from ..ops.facade import Ops, Tensor


def side_by_side(ops: Ops, payloads: Sequence[Sequence[Tensor]]) -> list:
    """The all-to-all's input: payload tensor k of every segment's blocks, concatenated in
    order (segment 0's blocks first). ``payloads``: each block's tensors, in that order."""
    return [ops.concat([tensors[k] for tensors in payloads]) for k in range(len(payloads[0]))]


def summed_segment(compressor: Compressor, ops: Ops, received: Sequence[Tensor],
                   blocks: Sequence[tuple], world: int, widen: Any = None) -> Tensor:
    """This rank's segment summed over the ranks, from the all-to-all's output ``received``
    (tensor k: every rank's tensor k of this segment, in rank order, its blocks side by side).
    ``blocks``: ``(ctx, info, tensors)`` of this rank's own blocks of the segment (their
    widths are every rank's); ``widen(t)``: a received tensor as the decoder takes it."""
    if len(blocks) == 1:
        ctx, info, _ = blocks[0]
        gathered = list(received) if widen is None else [widen(t) for t in received]
        return compressor.decompress_gathered(ops, gathered, ctx, info, world)
    parts = []   # [tensor k][rank][block]
    for k in range(len(blocks[0][2])):
        widths = [ops.numel(tensors[k]) for _, _, tensors in blocks]
        parts.append([ops.split(piece, widths) for piece in ops.split(received[k], [sum(widths)] * world)])
    decoded = []
    for position, (ctx, info, _) in enumerate(blocks):
        gathered = [ops.concat([by_rank[position] for by_rank in per_rank]) for per_rank in parts]
        gathered = gathered if widen is None else [widen(t) for t in gathered]
        decoded.append(compressor.decompress_gathered(ops, gathered, ctx, info, world))
    return ops.concat(decoded)
