"""Time of Horovod's collectives in the alpha-beta model, for a payload of B bytes on P ranks.

Every collective is a number of latency-bound steps plus the bytes one rank sends; the bytes
are :func:`hvdcompress.exchange.wire_bytes` (the engine's own cost model), so the plan and the
engine's byte accounting cannot drift apart::

    ring allreduce     2(P-1) alpha + 2(P-1)/P · B / beta
    ring allgather      (P-1) alpha +  (P-1)   · B / beta
    all-to-all          (P-1) alpha +  (P-1)/P · B / beta      (pairwise exchange)
    compressed allreduce = all-to-all of the P segments (B = the P segments' payloads)
                         + allgather of the re-compressed own segment (B / P):
                         2(P-1) alpha + 2(P-1)/P · B / beta, in two rounds

``flows``: how many ranks' traffic of this collective crosses one link at the same time. A ring
laid over N nodes in rank order crosses each node's NIC once per step (flows = 1); an
all-to-all over N nodes of L ranks sends L·(P-L)/P · B out of each NIC against (P-1)/P · B per
rank (flows = L(P-L)/(P-1), :func:`alltoall_flows`); the L cross-node exchanges of the
two-level scheme share the NIC (flows = L). The transfer term is multiplied by ``flows``.

Each function returns a :class:`Cost` whose latency and transfer parts stay apart: Horovod's
tensor fusion (:mod:`hvdcompress.plan.pipeline`) pays the latency of a fused collective once and
the transfers of all its tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..exchange import wire_bytes
from .links import Link


@dataclass(frozen=True)
class Cost:
    """One collective of one tensor: ``latency_s`` (steps × alpha, paid once per fused
    collective), ``transfer_s`` (bytes / beta, paid per tensor) and ``wire_bytes`` (what one
    rank sends)."""

    latency_s: float
    transfer_s: float
    wire_bytes: float = 0.0

    @property
    def total_s(self) -> float:
        return self.latency_s + self.transfer_s


FREE = Cost(0.0, 0.0, 0.0)


def _cost(steps: int, nbytes: float, link: Link, flows: float) -> Cost:
    return Cost(steps * link.alpha_s, flows * nbytes / link.beta_bytes_per_s, nbytes)


def allreduce(payload: float, ranks: int, link: Link, flows: float = 1.0) -> Cost:
    """Ring allreduce: 2(P-1) alpha + 2(P-1)/P · B / beta."""
    if ranks <= 1:
        return FREE
    return _cost(2 * (ranks - 1), wire_bytes("allreduce", payload, ranks), link, flows)


def allgather(payload: float, ranks: int, link: Link, flows: float = 1.0) -> Cost:
    """Ring allgather of one B-byte payload per rank: (P-1) alpha + (P-1) · B / beta."""
    if ranks <= 1:
        return FREE
    return _cost(ranks - 1, wire_bytes("allgather", payload, ranks), link, flows)


def alltoall(payload: float, ranks: int, link: Link, flows: float = 1.0) -> Cost:
    """All-to-all of B bytes cut in P parts, part j to rank j: (P-1) alpha + (P-1)/P · B / beta."""
    if ranks <= 1:
        return FREE
    return _cost(ranks - 1, wire_bytes("alltoall", payload, ranks) / 2, link, flows)


def compressed_allreduce(payload: float, ranks: int, link: Link, scatter_flows: float = 1.0,
                         gather_flows: float = 1.0) -> tuple:
    """The compressed allreduce's two rounds (Cost, Cost) for P segments of ``payload`` bytes in
    all: the all-to-all, then the ring allgather of one re-compressed segment (B / P)."""
    return (alltoall(payload, ranks, link, scatter_flows),
            allgather(payload / ranks, ranks, link, gather_flows))


def alltoall_flows(ranks: int, per_node: int) -> float:
    """``flows`` of an all-to-all over ``ranks`` ranks, ``per_node`` of them per node, on the
    inter-node link: NIC bytes L(P-L)/P · B over a rank's (P-1)/P · B."""
    return per_node * (ranks - per_node) / (ranks - 1) if ranks > 1 else 1.0
