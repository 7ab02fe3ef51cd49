"""Time of Horovod's collectives in the alpha-beta model, for a payload of B bytes on P ranks.

Every collective is a number of latency-bound steps plus the bytes one rank sends; the bytes
are :func:`hvdcompress.transport.collectives.wire_bytes` (the engine's own cost model), so the plan and the
engine's byte accounting cannot drift apart::

    ring allreduce     2(P-1) alpha + 2(P-1)/P · B / beta
    ring allgather      (P-1) alpha +  (P-1)   · B / beta      (Gloo, P = 2: 2·B / beta, below)
    all-to-all          (P-1) alpha +  (P-1)/P · B / beta      (Gloo: twice the transfer, below)
    compressed allreduce = all-to-all of the P segments (B = the P segments' payloads)
                         + allgather of the re-compressed own segment (B / P):
                         2(P-1) alpha + 2(P-1)/P · B / beta, in two rounds (Gloo, P >= 3: 3(P-1)/P)

``flows``: how many ranks' traffic of this collective crosses one link at the same time. A ring
laid over N nodes in rank order crosses each node's NIC once per step (flows = 1); an
all-to-all over N nodes of L ranks sends L·(P-L)/P · B out of each NIC against (P-1)/P · B per
rank (flows = L(P-L)/(P-1), :func:`alltoall_flows`); the L cross-node exchanges of the
two-level scheme share the NIC (flows = L). The transfer term is multiplied by ``flows``.

``reduce_s``: the allreduce's sums. The ring's reduce-scatter adds (P-1) received segments of
B/P bytes into the rank's own, (P-1)/P · B bytes summed at gamma seconds per byte (a dtype's
cost, :meth:`hvdcompress.plan.calibration.Calibration.reduce_s`); the caller passes
``reduce_s`` = gamma·B for the whole payload and the formula takes its (P-1)/P. The sums do not
overlap the transfer (on a CPU the same thread copies from the socket and sums: pessimistic
where the link is slower than the sum), so they add to the transfer term::

    ring allreduce     2(P-1) alpha + 2(P-1)/P · B / beta + (P-1)/P · gamma·B

**Pairwise exchanges go half duplex over Gloo** (``Link.half_duplex_pairs``). When a rank sends
one message to a peer and receives one from the same peer, Gloo carries both over one TCP pair and the two directions take turns
instead of overlapping: every step of the all-to-all (Gloo's ``alltoallv`` posts one send and
one receive per peer), and the ring allgather at P = 2, whose left and right neighbour are the
same rank (the allreduce, which also runs over one pair at P = 2, streams both ways in
segments). On this machine's loopback a 16 MB ``all_gather`` of two processes took 56-70 ms
against 9 ms for the same bytes swapped with ``isend``/``irecv``; pytorch/gloo#471 reports the
same (2 ranks 58% slower than 3 to 8 at the same bytes per rank, from 8-16 MB up). So those
transfers count both directions (x :data:`HALF_DUPLEX`). Trade-off: small payloads (well
inside the socket buffers) do overlap; the factor over-prices
them, where the latency term dominates anyway.

Each function returns a :class:`Cost` whose latency and transfer parts stay apart: Horovod's
tensor fusion (:mod:`hvdcompress.plan.pipeline`) pays the latency of a fused collective once and
the transfers of all its tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..transport.collectives import wire_bytes
from .links import Link


@dataclass(frozen=True)
class Cost:
    """One collective of one tensor: ``latency_s`` (steps × alpha, paid once per fused
    collective), ``transfer_s`` (bytes / beta and the allreduce's sums, paid per tensor) and
    ``wire_bytes`` (what one rank sends)."""

    latency_s: float
    transfer_s: float
    wire_bytes: float = 0.0

    @property
    def total_s(self) -> float:
        return self.latency_s + self.transfer_s


FREE = Cost(0.0, 0.0, 0.0)
HALF_DUPLEX = 2.0   # a pairwise exchange's transfer: both directions, one after the other


def _cost(steps: int, nbytes: float, link: Link, flows: float, compute_s: float = 0.0) -> Cost:
    return Cost(steps * link.alpha_s, flows * nbytes / link.beta_bytes_per_s + compute_s, nbytes)


def _pairwise(cost: Cost, link: Link) -> Cost:
    """``cost`` of a collective whose every step sends to and receives from one peer: its
    transfer doubled over a link whose pairs are half duplex."""
    return replace(cost, transfer_s=HALF_DUPLEX * cost.transfer_s) if link.half_duplex_pairs else cost


def allreduce(payload: float, ranks: int, link: Link, flows: float = 1.0, reduce_s: float = 0.0) -> Cost:
    """Ring allreduce: 2(P-1) alpha + 2(P-1)/P · B / beta + (P-1)/P · ``reduce_s`` (the sums,
    ``reduce_s`` = gamma·B for the whole payload)."""
    if ranks <= 1:
        return FREE
    return _cost(2 * (ranks - 1), wire_bytes("allreduce", payload, ranks), link, flows,
                 (ranks - 1) / ranks * reduce_s)


def allgather(payload: float, ranks: int, link: Link, flows: float = 1.0) -> Cost:
    """Ring allgather of one B-byte payload per rank: (P-1) alpha + (P-1) · B / beta; at P = 2
    over half-duplex pairs 2·B / beta (see the module doc)."""
    if ranks <= 1:
        return FREE
    cost = _cost(ranks - 1, wire_bytes("allgather", payload, ranks), link, flows)
    return _pairwise(cost, link) if ranks == 2 else cost   # the ring's two neighbours: one peer


def alltoall(payload: float, ranks: int, link: Link, flows: float = 1.0) -> Cost:
    """All-to-all of B bytes cut in P parts, part j to rank j: (P-1) alpha + (P-1)/P · B / beta,
    twice the transfer over half-duplex pairs (see the module doc)."""
    if ranks <= 1:
        return FREE
    return _pairwise(_cost(ranks - 1, wire_bytes("alltoall", payload, ranks) / 2, link, flows), link)


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
