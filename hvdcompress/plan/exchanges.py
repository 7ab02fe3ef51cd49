"""How one tensor is exchanged, as the engine does it: its rounds' costs, bytes and codec time.

``level`` is ``flat`` (:class:`hvdcompress.engines.exchange.Exchange` over all P ranks) or
``two-level`` (:class:`hvdcompress.engines.two_level.TwoLevel`: node reduce-scatter with the
mild ``intra_node`` compressor, the aggressive compressor on the node-summed shard between the
N nodes, node all-gather). ``collective`` is what per-rank payloads take, ``allgather`` or
``alltoall`` (the compressed allreduce); summable payloads take the allreduce whatever it is,
and a compressor whose payloads the compressed allreduce cannot carry has no ``alltoall``.

Flat, on N > 1 nodes the inter-node link carries it (rings at flows 1, the all-to-all at
:func:`~hvdcompress.plan.collectives.alltoall_flows`); on one node the intra-node link. Two-level,
for a tensor of n elements, L ranks per node, C₁ the intra-node compressor::

    round 0 : all-to-all of L segments of C₁(x) (n/L each) over L ranks, intra link
    cross   : C₂ on the shard (n/L, rows kept when L divides them) over N ranks, inter link,
              the L cross exchanges sharing the NIC (flows = L)
    last    : allgather of C₁(sum of the shard) over L ranks, intra link

Codec time (when calibrated): compression in the gradient hook (the P or L segments of the
compressed allreduce), the rest (decoding the gathered payloads, the server's re-compression
of the summed segment, the second level) in ``synchronize``. The allreduce's sums cost the
calibration's gamma per byte of each dtype (:mod:`hvdcompress.plan.collectives`). Codec time
and sums are CPU work on a CPU device: both stretch by the cluster's ``cpu_share``, and so does
the CPU's part of each link's seconds per byte (:meth:`hvdcompress.plan.Link.shared`).
"""
from __future__ import annotations

from typing import Mapping, NamedTuple, Optional

from ..transport.collectives import PAYLOAD_COLLECTIVES
from . import collectives as coll
from .calibration import Calibration
from .device import Device
from .links import Cluster, Link
from .payloads import measure, shard_shape, supports_alltoall

LEVELS = ("flat", "two-level")
COLLECTIVES = PAYLOAD_COLLECTIVES   # the collectives the cost model prices per-rank payloads by
NODE = "node/"   # the fusion keys of the two-level node rounds


class Exchange(NamedTuple):
    """One tensor's exchange: ``rounds`` of (fusion key, Cost), the collective its per-rank
    payloads took ('allreduce' when summable), ``fusion_bytes`` (its first round's payload),
    ``hook_s`` and ``sync_s`` of codec time."""

    rounds: tuple
    collective: str
    fusion_bytes: int
    hook_s: float = 0.0
    sync_s: float = 0.0

    @property
    def wire_bytes(self) -> float:
        """Bytes one rank sends in the rounds of the compressor under study (all but the
        two-level node rounds)."""
        return sum(cost.wire_bytes for key, cost in self.rounds if not key.startswith(NODE))

    @property
    def node_bytes(self) -> float:
        """Bytes one rank sends in the two-level node rounds (intra-node link)."""
        return sum(cost.wire_bytes for key, cost in self.rounds if key.startswith(NODE))


class Codec(NamedTuple):
    """Codec and reduction seconds of one compressor from a calibration (zero when not
    calibrated), stretched by ``share`` (the cluster's ``cpu_share``), and the device its
    payloads are measured on (None: torch's)."""

    spec: Mapping[str, str]
    calibration: Optional[Calibration]
    device: Optional[Device] = None
    share: float = 1.0

    def compress(self, numel: float, times: int = 1) -> float:
        fit = self.calibration.times(self.spec) if self.calibration else None
        return self.share * times * fit.compress_s(numel) if fit else 0.0

    def decode(self, numel: float, payloads: int = 1, times: int = 1) -> float:
        fit = self.calibration.times(self.spec) if self.calibration else None
        return self.share * times * fit.decode_s(numel, payloads) if fit else 0.0

    def reduce(self, parts: tuple) -> float:
        """gamma·B of one summed payload of ``parts`` ((dtype, bytes), ...)."""
        return self.share * self.calibration.reduce_s(parts) if self.calibration else 0.0


def _one_level(codec: Codec, shape: tuple, numel: int, collective: str, ranks: int, link: Link,
               ring_flows: float, a2a_flows: float, label: str) -> Optional[Exchange]:
    """The exchange of one tensor by one compressor over ``ranks`` ranks on ``link``."""
    payload = measure(codec.spec, shape, codec.device)
    if payload.summable:
        rounds = tuple((f"{label}/allreduce/{i}",
                        coll.allreduce(b, ranks, link, ring_flows, codec.reduce(parts)))
                       for i, (b, parts) in enumerate(zip(payload.rounds, payload.dtypes)))
        return Exchange(rounds, "allreduce", payload.rounds[0], codec.compress(numel), codec.decode(numel))
    if collective == "allgather":
        cost = coll.allgather(payload.total, ranks, link, ring_flows)
        return Exchange(((f"{label}/allgather", cost),), "allgather", payload.total,
                        codec.compress(numel), codec.decode(numel, ranks))
    if not supports_alltoall(codec.spec):
        return None
    length = -(-numel // ranks)
    segments = ranks * measure(codec.spec, (length,), codec.device).total
    scatter, gather = coll.compressed_allreduce(segments, ranks, link, a2a_flows, ring_flows)
    sync = codec.decode(length, ranks) + codec.compress(length) + codec.decode(length, times=ranks)
    return Exchange(((f"{label}/alltoall", scatter), (f"{label}/alltoall-gather", gather)),
                    "alltoall", segments, codec.compress(length, ranks), sync)


def exchange(spec: Mapping[str, str], shape: tuple, collective: str, level: str, cluster: Cluster,
             intra_node: Mapping[str, str], calibration: Optional[Calibration] = None,
             device: Optional[Device] = None) -> Optional[Exchange]:
    """How a tensor of ``shape`` is exchanged by ``spec``'s compressor (see the module doc);
    None where the combination does not exist (alltoall for a compressor that cannot take it,
    two-level on one node or with one rank per node). Payloads measured on ``device``
    (default torch's)."""
    numel = 1
    for size in shape:
        numel *= size
    codec = Codec(spec, calibration, device, cluster.cpu_share)
    nodes, local = cluster.nodes, cluster.gpus_per_node
    intra, inter = cluster.intra.shared(cluster.cpu_share), cluster.inter.shared(cluster.cpu_share)
    if level == "flat":
        link = inter if nodes > 1 else intra
        a2a = coll.alltoall_flows(cluster.ranks, local) if nodes > 1 else 1.0
        return _one_level(codec, shape, numel, collective, cluster.ranks, link, 1.0, a2a, "flat")
    if nodes == 1 or local == 1:
        return None
    cross = _one_level(codec, shard_shape(shape, numel, local), -(-numel // local), collective,
                       nodes, inter, local, local, "cross")
    if cross is None:
        return None
    mild, length = Codec(intra_node, calibration, device, cluster.cpu_share), -(-numel // local)
    segment = measure(intra_node, (length,), device).total
    rounds = ((NODE + "alltoall", coll.alltoall(local * segment, local, intra)), *cross.rounds,
              (NODE + "allgather", coll.allgather(segment, local, intra)))
    sync = (mild.decode(length, local) + cross.hook_s + cross.sync_s + mild.compress(length)
            + mild.decode(length, times=local))
    return Exchange(rounds, cross.collective, local * segment, mild.compress(length, local), sync)
