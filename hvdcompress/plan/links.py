"""Links and the cluster they make: the alpha-beta model of one hop, and the parsing of the
strings users give for them ("25gbit", "300gbyte", "10us").

A message of ``m`` bytes over a link costs ``alpha + m / beta``: ``alpha`` (seconds) is the
per-message latency (software, NIC, switch), ``beta`` (bytes per second) the bandwidth. Two
levels: ``intra`` between the ranks of one node (NVLink, PCIe, shared memory: each rank has its
own path) and ``inter`` between nodes (the node's NIC, shared by its ranks when several of them
send across it at once, see :mod:`hvdcompress.plan.collectives`).

**CPU share.** Ranks that train on CPUs and outnumber their host's cores time-slice them: every
rank's CPU work (compute, codec, the reduction's sums) stretches by ``cpu_share = ranks per
host / cores`` (:func:`cpu_share`, at least 1). GPU ranks: 1 (their work is on the GPU). So
does the CPU's part of a byte's transfer over TCP (the kernel's copies on both ends, which a
fast link leaves visible in a fitted beta): ``cpu_s_per_byte`` of a :class:`Link`, the excess
of the fitted ``1/beta`` over the wire's own seconds per byte. Under a share s a byte costs
``1/beta + (s - 1)·cpu_s_per_byte`` (:meth:`Link.shared`).

Trade-off: one (alpha, beta) per level ignores congestion in the switch fabric, multiple NICs
per node and NCCL's multiple channels; fit ``alpha`` and ``beta`` from probes of the real
network rather than trusting data-sheet numbers.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Optional

from ..contract.validation import check_int

#: bandwidth units -> bytes per second for one unit (decimal prefixes, as networks are sold).
BANDWIDTH_UNITS = {
    "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
    "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
}
#: latency units -> seconds for one unit.
LATENCY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-z]+)(?:/s|ps)?\s*$")


def _parse(param: str, value: str, units: dict, what: str) -> float:
    """``value`` ("25gbit", "10us") in the base unit of ``units``; a ``ValueError`` naming
    ``param``, the value and the allowed units otherwise."""
    allowed = (f"a positive number followed by a {what} unit ({', '.join(units)}), "
               f"e.g. '{'25gbit' if what == 'bandwidth' else '10us'}'")
    match = _QUANTITY.match(str(value).lower())
    if match is None or match.group(2) not in units:
        raise ValueError(f"{param}={value!r} is not a {what}; allowed: {allowed}")
    number = float(match.group(1)) * units[match.group(2)]
    if number <= 0:
        raise ValueError(f"{param}={value!r} is not positive; allowed: {allowed}")
    return number


def parse_bandwidth(param: str, value: str) -> float:
    """Bytes per second of "25gbit", "100mbit", "300gbyte" (an optional "/s" or "ps" suffix:
    "25gbit/s", "25gbitps"); decimal prefixes."""
    return _parse(param, value, BANDWIDTH_UNITS, "bandwidth")


def parse_latency(param: str, value: str) -> float:
    """Seconds of "10us", "5ms", "200ns", "0.001s"."""
    return _parse(param, value, LATENCY_UNITS, "latency")


@dataclass(frozen=True)
class Link:
    """One level of the network: ``alpha_s`` seconds per message, ``beta_bytes_per_s``,
    ``cpu_s_per_byte``, the CPU's part of ``1/beta`` (see the module doc; 0: none known), and
    ``half_duplex_pairs``: a pairwise exchange's two directions take turns (Gloo over TCP, see
    :mod:`hvdcompress.plan.collectives`; NCCL and MPI overlap them)."""

    alpha_s: float
    beta_bytes_per_s: float
    cpu_s_per_byte: float = 0.0
    half_duplex_pairs: bool = False

    def shared(self, share: float) -> "Link":
        """The link as ranks that time-share their cores by ``share`` see it: each byte's CPU
        part stretched, ``1/beta' = 1/beta + (share - 1)·cpu_s_per_byte``."""
        if share <= 1.0 or not self.cpu_s_per_byte:
            return self
        return replace(self, beta_bytes_per_s=1 / (1 / self.beta_bytes_per_s + (share - 1) * self.cpu_s_per_byte))


@dataclass(frozen=True)
class Cluster:
    """``nodes`` nodes of ``gpus_per_node`` ranks (rank r on node r // gpus_per_node, as
    horovodrun places them), ``intra`` within a node, ``inter`` between nodes; ``cpu_share``:
    how many times over the ranks' CPU work is time-sliced (see the module doc)."""

    nodes: int
    gpus_per_node: int
    intra: Link
    inter: Link
    cpu_share: float = 1.0

    def __post_init__(self) -> None:
        check_int("Cluster", "nodes", self.nodes, 1)
        check_int("Cluster", "gpus_per_node", self.gpus_per_node, 1)
        if not self.cpu_share >= 1.0:
            raise ValueError(f"Cluster: cpu_share={self.cpu_share!r}; allowed: a number >= 1 "
                             "(ranks per host / cores, 1 when every rank has a core)")

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node


def cpu_share(ranks_per_host: int, cores: Optional[int] = None) -> float:
    """``max(1, ranks_per_host / cores)``: the stretch of each rank's CPU work when CPU ranks
    outnumber the host's ``cores`` (default ``os.cpu_count()``)."""
    return max(1.0, ranks_per_host / (cores or os.cpu_count() or 1))
