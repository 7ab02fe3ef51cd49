"""Two-level compression (BytePS, Bagua, ZeRO++'s qgZ): mild compression inside a node, the
aggressive compressor only between nodes. One composer, :class:`TwoLevel`, for the allreduce of
data parallelism and the reduce-scatter of sharded training.

P ranks on N nodes of L ranks each (rank ``r`` on node ``r // L`` with local rank ``r % L``, as
the launchers place them). The ranks of one node form a node-local process set; the ranks with
the same local rank on different nodes form a cross-node set (L sets of N ranks). One step for a
tensor of n elements::

    node level, reduce-scatter: x_r cut into L shards, shard j compressed with the mild C₁ goes to
        local rank j (one all-to-all), which decodes and sums it:  s_j = Σ_{r in node} D₁(C₁(x_r[j]))
    cross level: s_j through the aggressive C₂'s engine over the cross-node set (N ranks)
    node level, all-gather (allreduce only): C₁'s server side of the cross level's result to
        every local rank, decoded, concatenated, cut to n, times predivide / P

The two node levels (:class:`NodeExchange`, :class:`NodeReduceScatter`) differ in what a shard
is and whether it comes back:

- **allreduce** (:class:`NodeExchange`): shard j is the j-th of L contiguous pieces (m = ⌈n/L⌉,
  zero-padded); the cross level is a flat :class:`Exchange` of C₂ at N ranks (whichever collective
  it picks for m elements: DGC's allgather, the compressed allreduce, CSC's and PowerSGD's
  rounds); the node all-gather brings the total back. The shard is named ``<tensor>#shard<j>``
  (identical on the ranks that exchange it). A compressor that takes the optimizer's momentum
  over (DGC, CSC, ``Momentum``) applies it to the node-summed shard, u ← μ·u + s_j (momentum is
  linear: the sum of the L ranks' momenta), with weight decay for the L ranks it stands for
  (the parameter shard times L); a matrix whose rows L divides keeps its shape for its rows
  (PowerSGD compresses it). States: C₁'s under ``seg<j>.`` / ``sum.``, C₂'s under ``cross.``.
- **reduce-scatter** (:class:`NodeReduceScatter`, the flat gradient of a sharded unit, P·c
  elements): rank n·L + l must end with chunk n·L + l summed over every rank, so the chunks are
  reordered first (local rank l receives chunks n'·L + l of every node n'); the cross level, a
  :class:`ReduceScatterExchange` of C₂ among the ranks of local index l, leaves node n with chunk
  n·L + l. Nothing comes back. States: C₁'s under ``node.c<j>.b<b>.``, C₂'s under ``cross.``.

Bytes per rank: inside the node 2(L-1)/L · |C₁(x)| (allreduce; (L-1)/L for the reduce-scatter);
between nodes only the shard's payload |C₂(s_j)| ≈ |C₂(x)| / L, the collective's growth with the
number of ranks in N, not P. The price: two more latency-bound rounds inside the node, and with
``FP16`` the result rounded to fp16, as Horovod's fp16 compression rounds its sum. With
``NoCompression`` on both levels the allreduce is the flat one up to the order of the float
additions ((r0 + r1) + (r2 + r3) instead of a ring's): bit-exact when the sums are exact.

The node and cross-node process sets, and registering them: :mod:`hvdcompress.transport.process_sets`.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, MutableMapping, Optional, Tuple

from ..contract.compressor import Compressor, TensorInfo
from ..ops.facade import Ops, Tensor
from ..state.prefixed import PrefixedState
from ..transport.collectives import Collectives, wire_bytes
from ..transport.exit_guard import guard_exit
from ..transport.rounds import Round
from .accounting import ByteCount
from .contract import Engine
from .exchange import Entry, Exchange
from .reduce_scatter import ReduceScatterExchange, ShardEntry

log = logging.getLogger("hvdcompress")


class NodeExchange(Exchange):
    """The allreduce's node level: the compressed allreduce's two halves over the node, apart
    (:meth:`scatter`, then :meth:`gather`), every tensor through the all-to-all (fp16 and full
    precision shards are decoded and summed like any other), averaged over ``nodes`` · L ranks."""

    summable_segments = True
    honours_dense = False   # the cross level honours TensorInfo.dense

    def __init__(self, compressor: Compressor, ops: Ops, comm: Collectives, nodes: int,
                 average: bool = True, predivide: float = 1.0):
        super().__init__(compressor, ops, comm, average, predivide, log_plan=False)
        self.nodes = nodes

    @property
    def ranks(self) -> int:
        return self.comm.world * self.nodes

    def collective_for(self, info: TensorInfo, like: Tensor) -> str:
        return "alltoall"

    def shard_name(self, name: str) -> str:
        return f"{name}#shard{self.comm.rank}"

    def shard_length(self, info: TensorInfo) -> int:
        return -(-info.numel // self.comm.world)

    def shard_param(self, info: TensorInfo) -> Optional[Tensor]:
        """This rank's shard of the parameter, times L (weight decay for the node's L ranks)."""
        if info.param is None:
            return None
        return self.segments(info.param, info.numel, self.comm.world)[self.comm.rank] * float(self.comm.world)

    def scatter(self, flight: Round) -> list:
        """Wait for the all-to-all: each entry with its shard summed over the node."""
        return [(send.entry, self._segment_sum(send.entry, received)) for send, received in self.arrivals(flight)]

    def gather(self, shards: list, out_of: Callable[[Entry], Optional[Tensor]]) -> None:
        """All-gather each entry's reduced shard (C₁'s server side) and decode its total."""
        sends = [self._share_segment(entry, shard) for entry, shard in shards]
        if sends:
            self.finish(self._launch(sends, 1, sends[0].entry.info.name), out_of)


class NodeReduceScatter(ReduceScatterExchange):
    """The reduce-scatter's node level: the unit's chunks reordered so that local rank l
    receives, summed over the node, chunk n'·L + l of every node n' (module doc)."""

    def __init__(self, compressor: Compressor, ops: Ops, comm: Collectives, nodes: int, block: int = 4096):
        super().__init__(compressor, ops, comm, block)
        self.nodes = nodes

    def _node_info(self, info: TensorInfo) -> TensorInfo:
        return TensorInfo(name=info.name, numel=info.numel, world=self.comm.world, rank=self.comm.rank,
                          shape=(info.numel,))

    def init_state(self, x: Tensor, state: MutableMapping, info: TensorInfo) -> None:
        super().init_state(x, PrefixedState(state, "node."), self._node_info(info))

    def compress(self, key: Any, x: Tensor, state: MutableMapping, info: TensorInfo) -> ShardEntry:
        ops, per_node, nodes = self.ops, self.comm.world, self.nodes
        chunks = ops.split(x, [info.numel // (per_node * nodes)] * (per_node * nodes))
        ordered = ops.concat([chunks[n * per_node + j] for j in range(per_node) for n in range(nodes)])
        entry = super().compress(key, ordered, PrefixedState(state, "node."), self._node_info(info))
        entry.state = state
        return entry

    def shard_name(self, name: str) -> str:
        return name

    def shard_length(self, info: TensorInfo) -> int:
        return info.numel // self.comm.world

    def shard_param(self, info: TensorInfo) -> None:
        return None   # no take-over runs sharded (check_sharded)

    def gather(self, shards: list, out_of: Callable[[Any], Optional[Tensor]]) -> None:
        """Nothing comes back: each entry's shard into ``out_of(entry)``, in its dtype."""
        for entry, shard in shards:
            entry.total = self.written(out_of(entry), shard)


class TwoLevel(Engine):
    """The engine over two process sets (module doc): ``node`` (:class:`NodeExchange` or
    :class:`NodeReduceScatter`, the mild compressor) and ``cross`` (an :class:`Exchange` or a
    :class:`ReduceScatterExchange` of the aggressive ``compressor``, summing: the node level
    scales). ``everyone``: the global set's collectives, for the exit barrier (exit_guard).

    ``last_step_bytes`` / ``total_bytes``: the dense bytes of this rank's gradients versus the
    bytes it sends between nodes; ``last_node_bytes`` / ``total_node_bytes``: the payloads it
    sends inside the node. ``plan``: the node level's, per tensor; :meth:`plan_table` both."""

    def __init__(self, node: Any, cross: Any, everyone: Optional[Collectives] = None):
        self.node, self.cross, self.everyone = node, cross, everyone
        self.compressor, self.intra_node = cross.compressor, node.compressor
        self.ops, self.comm, self.collective, self.plan = node.ops, node.comm, cross.collective, node.plan
        self.last_step_bytes, self.total_bytes = ByteCount(), ByteCount()
        self.last_node_bytes, self.total_node_bytes = ByteCount(), ByteCount()
        self._logged = False

    @property
    def ranks(self) -> int:
        return self.comm.world * self.cross.comm.world

    def cross_node_bytes(self, gathered: ByteCount) -> ByteCount:
        """The reduce-scatter's bytes to the other nodes' ranks (P = N·L ranks), with ``gathered``
        (an all-gather's count over all P ranks: each rank's shard once) added: ``sent`` = the cross
        level's payloads for the other N - 1 nodes (fixed-size chunks: (N - 1)/N of them), plus each
        gathered payload to the P - L ranks off the node; ``dense`` = what a flat collective of the
        dense tensors sends there: (P - L)/P of each flat gradient, each shard times P - L."""
        nodes, world = self.cross.comm.world, self.ranks
        off = world - self.comm.world
        return ByteCount(self.total_bytes.dense * off // world + gathered.dense * off,
                         self.total_bytes.sent * (nodes - 1) // nodes + gathered.sent * off, self.total_bytes.steps)

    @property
    def step_bytes(self) -> ByteCount:
        """This step's bytes between nodes so far (a front end adds what it sends apart)."""
        return self.cross.step_bytes

    def collective_for(self, info: TensorInfo, like: Tensor) -> str:
        return "alltoall"   # the node's reduce-scatter, whatever the intra-node compressor

    def describe(self) -> str:
        return (f"{self.intra_node.name} within nodes of {self.comm.world}, "
                f"{self.compressor.name} across {self.cross.comm.world} nodes")

    def _cross_info(self, info: TensorInfo) -> TensorInfo:
        """The shard's info for the aggressive compressor: the cross set's world and rank, the
        optimizer's settings, the parameter shard for a take-over, a matrix's shape for its rows."""
        per_node, length = self.comm.world, self.node.shard_length(info)
        rows = info.shape[0] if len(info.shape) >= 2 else 0
        shape = (rows // per_node, *info.shape[1:]) if rows and rows % per_node == 0 else (length,)
        param = self.node.shard_param(info) if self.compressor.takes_over_momentum else None
        return TensorInfo(name=self.node.shard_name(info.name), numel=length, world=self.cross.comm.world,
                          shape=shape, rank=self.cross.comm.rank, param=param,
                          momentum=info.momentum, nesterov=info.nesterov,
                          weight_decay=info.weight_decay, dense=info.dense, mild=info.mild)

    def init_state(self, x: Tensor, state: MutableMapping, info: TensorInfo) -> None:
        """Both levels' state for one tensor (the node level's, and the shard's under ``cross.``),
        for a front end that makes it ahead of the step (TensorFlow's variables); each level
        makes its own at its first compression otherwise."""
        if info.numel == 0:
            return
        self.node.init_state(x, state, info)
        self.cross.init_state(self.ops.zeros(self.node.shard_length(info), like=x),
                              PrefixedState(state, "cross."), self._cross_info(info))

    def compress(self, key: Any, x: Tensor, state: MutableMapping, info: TensorInfo) -> Any:
        if self.everyone is not None and info.numel:
            guard_exit(self.everyone, self.ops.zeros(1, like=x))
        return self.node.compress(key, x, state, info)

    def start(self, entries: list) -> Any:
        return self.node.start(entries)

    def finish(self, flight: Any, out_of: Callable[[Any], Optional[Tensor]] = lambda e: None) -> list:
        """The node's reduce-scatter, every shard's cross level, the node's all-gather (allreduce)."""
        shards = self.node.scatter(flight)
        entries = [entry for entry, _ in shards]
        crossing = [self.cross.compress(i, shard, PrefixedState(entry.state, "cross."), self._cross_info(entry.info))
                    for i, (entry, shard) in enumerate(shards)]
        crossed = self.cross.finish(self.cross.start(crossing)) if crossing else []
        self.node.gather([(entries[c.key], c.total) for c in crossed], out_of)
        return entries

    def end_step(self) -> None:
        """Close the step: inter-node bytes into ``last_step_bytes``, the node's into
        ``last_node_bytes``; both compressors' step; log both levels' plan once (rank 0 of both)."""
        self.node.end_step()
        self.cross.end_step()
        self.last_node_bytes = self.node.last_step_bytes
        self.total_node_bytes.merge(self.last_node_bytes)
        self.last_step_bytes = ByteCount(self.last_node_bytes.dense, self.cross.last_step_bytes.sent, 1)
        self.total_bytes.merge(self.last_step_bytes)
        self.intra_node.on_step()
        if not self._logged and self.plan:
            self._logged = True
            if self.comm.rank == 0 and self.cross.comm.rank == 0:
                log.info("hvdcompress exchange plan (P=%d, %s):\n%s", self.ranks, self.describe(), self.plan_table())

    def plan_table(self) -> str:
        """Per tensor: the node level's payload, and the shard's collective, payload and wire
        bytes between nodes, next to the flat dense allreduce's bytes per rank at P."""
        rows = ["tensor | numel | node payload B | cross collective | cross payload B | "
                "inter-node wire B/rank | flat dense wire B/rank"]
        for name, (numel, _, sent, _) in sorted(self.plan.items()):
            shard = self.cross.plan.get(self.node.shard_name(name))
            if shard is None:
                continue
            _, collective, cross_sent, cross_wire = shard
            dense = wire_bytes("allreduce", 4 * numel, self.ranks)
            rows.append(f"{name} | {numel} | {sent} | {collective} | {cross_sent} | "
                        f"{cross_wire:.0f} | {dense:.0f}")
        return "\n".join(rows)


def two_level(compressor: Compressor, intra_node: Compressor, ops: Ops,
              node_comms: Callable[[], Tuple[Collectives, Collectives]], *, sharded: bool = False,
              average: bool = True, predivide: float = 1.0, collective: str = "auto",
              everyone: Optional[Collectives] = None, block: int = 4096) -> TwoLevel:
    """The two-level engine of the allreduce (``sharded=False``) or the reduce-scatter."""
    node, cross = node_comms()
    if sharded:
        return TwoLevel(NodeReduceScatter(intra_node, ops, node, cross.world, block),
                        ReduceScatterExchange(compressor, ops, cross, block), everyone)
    return TwoLevel(NodeExchange(intra_node, ops, node, cross.world, average, predivide),
                    Exchange(compressor, ops, cross, average=False, collective=collective, log_plan=False),
                    everyone)
