"""The compressed reduce-scatter: the first half of the compressed allreduce, for sharded training.

A sharded data-parallel unit (an FSDP unit: many parameters flattened into one buffer) needs on
rank r only the sum over ranks of chunk r of the flat gradient. Each rank cuts its flat gradient
``x`` (P·L elements) into the P chunks of length L and each chunk into blocks of at most ``block``
elements, compresses every block with its own state (error feedback per chunk, block and rank),
and one all-to-all sends chunk j's payloads to rank j; rank r decodes the P ranks' payloads of
each of its blocks and sums them in float32::

    shard_r = scale · Σ_q D(C(x_q[chunk r]))        (one all-to-all; scale 1/P for an average)

Bytes each rank sends: (P-1)/P of its compressed payload, the reduce-scatter's share, flat in P;
the payloads must have a size fixed by the block's length (quantisers, int8, fp16/bf16, onebit,
EF-signSGD, top-k and random-k, all with any error feedback): a sparsifier whose count varies
(DGC, threshold), several rounds (PowerSGD, CSC), a vote (signum) and the momentum or Adam
take-overs (the optimizer state is sharded) are refused by :func:`check_sharded`.

Blocks: a flat unit gradient concatenates many parameters, so a statistic per block (onebit's
scale, top-k's selection) spans fewer layers than one per chunk: the smaller ``block``, the closer
to the per-tensor compressor, at the price of one codec call and a scale per block. Sparse
payloads address a block of at most 2**15 elements, so their indices travel as int16 (a top-k
element costs 4 + 2 bytes: 13x fewer bytes than dense at 5% density instead of exactly 10x).
Gradients in float16/bfloat16 (mixed precision's reduce dtype) are compressed, and their
residuals kept, in float32; the decoded sum is written in the output's dtype.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, MutableMapping, NamedTuple, Optional, Sequence

import numpy as np

from ..compressors.sparse import SparseCompressor
from ..contract.compressor import Compressor, TensorInfo, payload_bytes
from ..ops.facade import Ops, Tensor
from ..state.prefixed import PrefixedState
from ..state.reshard import PER_RANK
from ..transport.collectives import Collectives, Planner
from ..transport.rounds import launch_alltoall, wait
from .accounting import ByteCount
from .contract import Engine
from .segments import side_by_side, summed_segment

#: the largest block whose sparse indices fit in int16
INT16_BLOCK = 2 ** 15


def check_sharded(compressor: Compressor) -> Compressor:
    """``compressor`` if the compressed reduce-scatter can run it, else a ValueError naming it."""
    if isinstance(compressor, Planner):
        raise ValueError(f"compression={compressor!r}: 'auto' plans each tensor's compressor and collective "
                         "on the flat exchange; the sharded reduce-scatter takes a fixed compressor "
                         "(e.g. Int8(), ErrorFeedback(OneBit()), ErrorFeedback(TopK(0.05)))")
    if compressor.takes_over_momentum or compressor.takes_over_adam:
        raise ValueError(f"compression={compressor!r} takes the optimizer's momentum or Adam over, "
                         "which needs every coordinate's optimizer state on every rank; under FSDP the "
                         "optimizer state is sharded: use a compressor without a take-over (e.g. "
                         "ErrorFeedback(OneBit()), ErrorFeedback(TopK(0.05)), Int8()) and the optimizer's own momentum")
    algorithm = compressor.unwrap()
    if not algorithm.fixed_size_payload:
        raise ValueError(f"compression={compressor!r}: the compressed reduce-scatter sends each chunk's "
                         "payload to its rank in one all-to-all, so it needs one round of payloads whose "
                         "size is fixed by the chunk's (a compressor declaring fixed_size_payload: int8, fp16, bf16, "
                         "onebit, efsignsgd, the quantisers, topk, randomk); DGC and threshold select a varying count, PowerSGD and CSC need "
                         "several rounds over the whole tensor, signum votes")
    if not algorithm.keeps_precision:
        warnings.warn(f"compression={compressor!r} under FSDP's sharded reduce-scatter: a compressor that drops "
                      "or signs most of each element converged far from dense FSDP on the benchmarks even with "
                      "error feedback (no momentum or Adam take-over: the optimizer state is sharded); int8, "
                      "fp16 and bf16 hold. Under HSDP, compress the all-reduce across nodes instead "
                      "(docs/fsdp.md)", UserWarning)
    return compressor


class Block(NamedTuple):
    """One compressed block of a unit: chunk j's block b, its packet, info and wire tensors."""

    chunk: int
    index: int
    packet: Any
    info: TensorInfo
    tensors: list


@dataclass
class ShardEntry:
    """One unit's compressed chunks: its :class:`Block` s, chunk by chunk."""

    key: Any
    info: TensorInfo
    dtype: str
    state: MutableMapping
    blocks: list = field(default_factory=list)
    total: Optional[Tensor] = None


class ReduceScatterExchange(Engine):
    """The engine of a sharded front end (:mod:`hvdcompress.torch.fsdp`): the driver's
    ``engine`` (bytes, plan, ``collective`` for the rank agreement), with :meth:`compress`,
    :meth:`start`, :meth:`finish` as :class:`hvdcompress.engines.exchange.Exchange`'s."""

    collective = "alltoall"

    def __init__(self, compressor: Compressor, ops: Ops, comm: Collectives, block: int = 4096):
        self.compressor = check_sharded(compressor)
        self.ops = ops
        self.comm = comm
        self.block = block
        self.compact = isinstance(compressor.unwrap(), SparseCompressor) and block <= INT16_BLOCK
        self.step_bytes = ByteCount(steps=1)
        self.last_step_bytes = ByteCount()
        self.total_bytes = ByteCount()
        self.plan: dict = {}

    def _cuts(self, length: int) -> list:
        return [min(self.block, length - start) for start in range(0, length, self.block)]

    def _block_info(self, info: TensorInfo, chunk: int, index: int, width: int) -> TensorInfo:
        return TensorInfo(name=f"{info.name}#c{chunk}b{index}", numel=width, world=self.comm.world,
                          rank=self.comm.rank, shape=(width,))

    def init_state(self, x: Tensor, state: MutableMapping, info: TensorInfo) -> None:
        """Every block's compressor state (``c<chunk>.b<block>.``), where it is missing (float32,
        whatever the gradient's dtype: blocks are compressed in float32)."""
        for j in range(self.comm.world):
            for b, width in enumerate(self._cuts(info.numel // self.comm.world)):
                sub = PrefixedState(state, f"c{j}.b{b}.")
                if not len(sub):
                    self.compressor.init_state(self.ops, self.ops.zeros(width, like=x, dtype="float32"), sub,
                                               self._block_info(info, j, b, width))

    def compress(self, key: Any, x: Tensor, state: MutableMapping, info: TensorInfo) -> ShardEntry:
        """Compress the P chunks of ``x`` (``info.numel`` = P·L elements), block by block."""
        ops, world = self.ops, self.comm.world
        if info.numel % world:
            raise ValueError(f"'{info.name}': a flat gradient of {info.numel} elements does not cut "
                             f"into {world} equal chunks (the sharded front end pads it)")
        entry = ShardEntry(key, info, ops.dtype(x), state)
        flat = x if entry.dtype == "float32" else ops.cast(x, "float32")
        length = info.numel // world
        cuts = self._cuts(length)
        self.init_state(flat, state, info)
        sent = 0
        for j, chunk in enumerate(ops.split(flat, [length] * world)):
            for b, piece in enumerate(ops.split(chunk, cuts) if len(cuts) > 1 else [chunk]):
                binfo = self._block_info(info, j, b, cuts[b])
                packet = self.compressor.compress(ops, piece, PrefixedState(state, f"c{j}.b{b}."), binfo)
                if packet.resume is not None:
                    raise RuntimeError(f"{self.compressor!r} produced a multi-round packet")
                tensors = [ops.cast(t, "int16") if self.compact and ops.dtype(t) == "int32" else t
                           for t in packet.tensors]
                entry.blocks.append(Block(j, b, packet, binfo, tensors))
                sent += payload_bytes(ops, tensors)
        self.step_bytes.add(info.numel * ops.element_size(x), sent)
        self.plan[info.name] = (info.numel, self.collective, sent, sent * (world - 1) // world)
        return entry

    def start(self, entries: list) -> list:
        """One all-to-all per entry: chunk j's payload tensors, side by side, to rank j."""
        return [(entry, launch_alltoall(self.ops, self.comm, side_by_side(self.ops, [b.tensors for b in entry.blocks]),
                                        f"hvdc.rs.{entry.info.name}")) for entry in entries]

    def finish(self, flights: list, out_of: Any = lambda e: None) -> list:
        """Decode and sum this rank's chunk of every entry (float32), into ``out_of(entry)``."""
        ops, me = self.ops, self.comm.rank
        widen = (lambda t: ops.cast(t, "int32") if ops.dtype(t) == "int16" else t) if self.compact else None
        done = []
        for entry, handle in flights:
            mine = [(b.packet.ctx, b.info, b.tensors) for b in entry.blocks if b.chunk == me]
            flat = summed_segment(self.compressor, ops, wait(ops, self.comm, handle), mine, self.comm.world, widen)
            entry.total = self.written(out_of(entry), flat)
            done.append(entry)
        return done

    def written(self, out: Optional[Tensor], flat: Tensor) -> Tensor:
        """The float32 sum ``flat`` into ``out`` (None: ``flat`` itself), in ``out``'s dtype."""
        return self.ops.into(out, flat if out is None or self.ops.dtype(out) == "float32"
                             else self.ops.cast(flat, self.ops.dtype(out)))

    def scatter(self, flights: list) -> list:
        """:meth:`finish` without a buffer: each entry with this rank's summed chunk (float32)."""
        return [(entry, entry.total) for entry in self.finish(flights)]

    def end_step(self) -> None:
        self.last_step_bytes = self.step_bytes
        self.total_bytes.merge(self.step_bytes)
        self.step_bytes = ByteCount(steps=1)


_BLOCK_KEY = re.compile(r"^c(\d+)\.b(\d+)\.(.+)$")


def pooled_units(ranks: Sequence[Mapping[str, Mapping[str, Any]]], average: bool = True) -> dict:
    """Every unit's state for a run at another world size, from every old rank's (numpy arrays
    under ``c<chunk>.b<block>.<entry>`` keys): per-rank additive entries (:data:`PER_RANK`) over
    the whole flat tensor, summed over the old ranks in float64 and divided by the old number of
    ranks (each new rank's share: :mod:`hvdcompress.state.reshard`'s rule for op=Average); any other
    entry as rank 0 holds it in its first block. For :func:`laid_out`."""
    if not average:
        raise ValueError("a sharded state pools its residuals for op=Average only")
    out: dict = {}
    for unit in sorted({u for r in ranks for u in r}):
        wholes, shared = {}, {}
        for state in (r.get(unit, {}) for r in ranks):
            blocks: dict = {}
            for key, value in state.items():
                j, b, base = _BLOCK_KEY.match(key).groups()
                if base in PER_RANK:
                    blocks.setdefault(base, []).append(((int(j), int(b)), value))
                elif (j, b) == ("0", "0"):
                    shared.setdefault(base, value)
            for base, pieces in blocks.items():
                flat = np.concatenate([np.asarray(v).reshape(-1) for _, v in sorted(pieces, key=lambda p: p[0])])
                total, dtype = wholes.get(base, (0.0, flat.dtype))
                wholes[base] = (total + flat.astype(np.float64), dtype)
        out[unit] = {"whole": {b: (t / len(ranks)).astype(d) for b, (t, d) in wholes.items()}, "shared": shared}
    return out


def laid_out(pooled: Mapping[str, Any], numel: int, world: int, block: int) -> dict:
    """One unit's :func:`pooled_units` entry cut for this run: chunks of ``numel / world``
    elements, blocks of at most ``block`` (zero-padded or cut to ``numel``)."""
    length = numel // world
    cuts = [min(block, length - s) for s in range(0, length, block)]
    out: dict = {}
    for base, whole in pooled["whole"].items():
        flat = np.zeros(numel, whole.dtype)
        flat[:min(numel, whole.size)] = whole[:numel]
        for j in range(world):
            start = j * length
            for b, width in enumerate(cuts):
                out[f"c{j}.b{b}.{base}"] = flat[start:start + width].copy()
                start += width
    for base, value in pooled["shared"].items():
        out.update({f"c{j}.b{b}.{base}": value for j in range(world) for b in range(len(cuts))})
    return out
