"""Two-level compression (BytePS, Bagua): mild compression inside a node, the aggressive
compressor only between nodes, on the exchange engine (:mod:`hvdcompress.engines.exchange`).

P ranks on N nodes of L ranks each (rank ``r`` on node ``r // L`` with local rank ``r % L``, as
horovodrun places them). The ranks of one node form a node-local process set; the ranks with
the same local rank on different nodes form a cross-node set (L sets of N ranks). One step for a
tensor of n elements, m = ⌈n / L⌉::

    x_r  padded to L·m, cut into L shards x_r[j]                                      (every rank r)
    node reduce-scatter: shard j, compressed with the mild ``intra_node`` compressor C₁, goes to
        local rank j (all-to-all); local rank j decodes and sums:  s_j = Σ_{r in node} D₁(C₁(x_r[j]))
    cross-node exchange of s_j with the aggressive compressor C₂ over the cross-node set, by
        whichever collective the engine picks for m elements at N ranks (DGC's allgather, the
        compressed allreduce, CSC's and PowerSGD's rounds, ...):  t_j = Σ_{nodes} D₂(C₂(s_j))
    node all-gather of C₁'(t_j) (C₁'s server side: its own residual where C₁ keeps one), decode,
        concatenate, cut to n, times predivide / P (op=Average: the global sum / P)

Bytes per rank: inside the node (fast links) 2(L-1)/L · B₁ for a payload of B₁ = |C₁(x)|; between
nodes only the shard's payload |C₂(s_j)| ≈ |C₂(x)| / L, sent by the engine's cost model for N
ranks: inter-node bytes divide by L compared with the flat exchange of C₂ over P ranks, and the
collective's growth with the number of ranks is in N, not P. The price: two more latency-bound
rounds inside the node, and the node all-gather of C₁-compressed shards (with ``FP16`` the
result is rounded to fp16, as Horovod's fp16 compression rounds its sum).

With ``NoCompression`` on both levels the result is the flat allreduce's up to the order of the
float additions ((r0 + r1) + (r2 + r3) instead of Horovod's ring order): bit-exact when the sums
are exact (integer-valued gradients), to float rounding otherwise.

State and momentum: C₂'s per-tensor state (residuals, DGC's momentum and velocity) is the state
of the shard this rank owns, kept in the tensor's own state dict under ``cross.`` (so checkpoints
keep it), with the shard named ``<tensor>#shard<j>`` (identical on the ranks that exchange it). A
compressor that takes the optimizer's momentum over (DGC, CSC, ``Momentum``) applies it to the
node-summed shard: u ← μ·u + s_j (momentum is linear, so this is the sum of the L ranks'
momenta), and weight decay for the L ranks the shard stands for (the parameter shard is handed
over times L: s_j + L·λ·w_j). DGC's own ``clip_norm`` then clips the node-summed shard by the
number of nodes N. Size thresholds of C₂ (DGC's and CSC's ``min_numel``: smaller tensors go
dense) see the shard's m = n / L elements. C₁'s state (if any) lives under ``seg<j>.`` and ``sum.``.

The node and cross-node process sets, and registering them: :mod:`hvdcompress.transport.process_sets`.
"""
from __future__ import annotations

from typing import Optional

from ..contract.compressor import Compressor, TensorInfo
from ..ops.facade import Ops, Tensor
from ..transport.collectives import Collectives, wire_bytes
from ..transport.exit_guard import guard_exit
from .accounting import ByteCount
from .exchange import Entry, Exchange, PrefixedState, Send


class TwoLevelExchange(Exchange):
    """The exchange engine over two process sets (see the module doc for the algorithm).

    The node level is the engine's compressed allreduce over ``node`` with the mild
    ``intra_node`` compressor (``self.compressor``; summable fp16 / full-precision shards are
    decoded and summed like any other); between its reduce-scatter and its all-gather, the
    node-summed shard goes through ``self.cross``, a flat :class:`Exchange` of ``compressor``
    over ``cross``, which picks its collective for the shard's size at N ranks (``collective``:
    'auto', 'allgather' or 'alltoall', as for the flat exchange).

    ``last_step_bytes`` / ``total_bytes``: the dense bytes of this rank's gradients versus the
    bytes it sends between nodes; ``last_node_bytes`` / ``total_node_bytes``: the payloads it
    sends inside the node.
    """

    summable_segments = True
    honours_dense = False

    def __init__(self, compressor: Compressor, intra_node: Compressor, ops: Ops, node: Collectives,
                 cross: Collectives, average: bool = True, predivide: float = 1.0,
                 collective: str = "auto", everyone: Optional[Collectives] = None):
        super().__init__(intra_node, ops, node, average, predivide)
        self.everyone = everyone   # the global set's collectives: the exit barrier (exit_guard)
        # this engine logs the plan of both levels
        self.cross = Exchange(compressor, ops, cross, average=False, collective=collective,
                              log_plan=False)
        self.collective = self.cross.collective
        self.last_node_bytes = ByteCount()
        self.total_node_bytes = ByteCount()

    @property
    def ranks(self) -> int:
        return self.comm.world * self.cross.comm.world

    def collective_for(self, info: TensorInfo, like: Tensor) -> str:
        return "alltoall"   # the node's reduce-scatter, whatever the intra-node compressor

    def describe(self) -> str:
        return (f"{self.compressor.name} within nodes of {self.comm.world}, "
                f"{self.cross.compressor.name} across {self.cross.comm.world} nodes")

    # ---- the shard this rank owns ----------------------------------------------------------------
    def _cross_info(self, info: TensorInfo, length: int) -> TensorInfo:
        """The shard's info for the aggressive compressor: named by the local rank (the same on
        every rank of the cross-node set), the cross set's world and rank, the optimizer's
        momentum settings, and the parameter shard times L (weight decay for L ranks). A matrix
        whose rows L divides keeps its shape for its shard of rows (PowerSGD compresses it);
        any other shard is a vector."""
        me, per_node = self.comm.rank, self.comm.world
        param = None
        if info.param is not None and self.cross.compressor.takes_over_momentum:
            param = self.segments(info.param, info.numel, per_node)[me] * float(per_node)
        rows = info.shape[0] if len(info.shape) >= 2 else 0
        shape = (rows // per_node, *info.shape[1:]) if rows and rows % per_node == 0 else (length,)
        return TensorInfo(name=f"{info.name}#shard{me}", numel=length, world=self.cross.comm.world,
                          shape=shape, rank=self.cross.comm.rank, param=param,
                          momentum=info.momentum, nesterov=info.nesterov,
                          weight_decay=info.weight_decay, dense=info.dense, mild=info.mild)

    def init_state(self, x: Tensor, state, info: TensorInfo) -> None:
        """The node level's state (``seg<j>.``, ``sum.``) and the shard's (``cross.``)."""
        if info.numel == 0:
            return
        if self.everyone is not None:
            guard_exit(self.everyone, self.ops.zeros(1, like=x))
        super().init_state(x, state, info)
        length = -(-info.numel // self.comm.world)
        self.cross.init_state(self.ops.zeros(length, like=x), PrefixedState(state, "cross."),
                              self._cross_info(info, length))

    def _reduce_segment(self, entry: Entry, received: list) -> Send:
        """After the node's all-to-all: sum this rank's shard over the node, then run the
        shard's cross-node exchange (its rounds ride in this entry's sends, over ``cross``);
        its total goes on to the node's all-gather."""
        shard = self._segment_sum(entry, received)
        inner = self.cross.compress(entry.key, shard, PrefixedState(entry.state, "cross."),
                                    self._cross_info(entry.info, self.ops.numel(shard)))
        return self._relay(entry, Send(inner, inner.packet.tensors, inner.collective))

    def _relay(self, entry: Entry, send: Send) -> Send:
        """``send`` of the cross-node exchange, carried by ``entry`` over the cross-node set."""
        def then(_: Entry, received: list, collective: str, out_of) -> Send:
            nxt = (send.then or self.cross.after_round)(send.entry, received, collective, lambda e: None)
            if nxt is not None:
                return self._relay(entry, nxt)
            return self._share_segment(entry, send.entry.total)
        return Send(entry, send.tensors, send.collective, then, self.cross.comm)

    # ---- bookkeeping -----------------------------------------------------------------------------
    def end_step(self) -> None:
        """Close the step: inter-node bytes into ``last_step_bytes``, the node's into
        ``last_node_bytes``; log both levels' plan once (global rank 0)."""
        node = self.step_bytes
        self.last_node_bytes = node
        self.total_node_bytes.merge(node)
        self.step_bytes = ByteCount(dense=node.dense, sent=self.cross.step_bytes.sent, steps=1)
        self.cross.end_step()
        self.compressor.on_step()
        super().end_step()

    def _logs_plan(self) -> bool:
        return self.comm.rank == 0 and self.cross.comm.rank == 0

    def plan_table(self) -> str:
        """Per tensor: the node level's payload, and the shard's collective, payload and wire
        bytes between nodes, next to the flat dense allreduce's bytes per rank at P."""
        rows = ["tensor | numel | node payload B | cross collective | cross payload B | "
                "inter-node wire B/rank | flat dense wire B/rank"]
        for name, (numel, _, sent, _) in sorted(self.plan.items()):
            shard = self.cross.plan.get(f"{name}#shard{self.comm.rank}")
            if shard is None:
                continue
            _, collective, cross_sent, cross_wire = shard
            dense = wire_bytes("allreduce", 4 * numel, self.ranks)
            rows.append(f"{name} | {numel} | {sent} | {collective} | {cross_sent} | "
                        f"{cross_wire:.0f} | {dense:.0f}")
        return "\n".join(rows)
