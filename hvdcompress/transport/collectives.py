"""Horovod's collectives as the engine sees them: the :class:`Collectives` a framework supplies,
the bytes each puts on a rank's link (:func:`wire_bytes`), and which one a tensor's payloads
take (:func:`choose_collective`, or a :class:`Planner` compressor's own pick).

The collective of each tensor (:func:`choose_collective`, identical on every rank because it
depends only on the compressor, the tensor's size and the number of ranks P):

* ``allreduce``: summable payloads (fp16, random-k, PowerSGD's factors, CSC's chunks, DGC's
  dense warm-up). Ring allreduce: 2(P-1)/P · B bytes per rank for a payload of B bytes.
* ``allgather``: per-rank payloads (top-k, DGC, threshold, quantisers at P <= 2). (P-1) · B:
  grows with P.
* ``alltoall``: compressed allreduce for fixed-size per-rank payloads (the quantisers, bf16):
  the flat gradient is cut into P equal segments (zero-padded), segment j is compressed and sent
  to rank j (all-to-all: a reduce-scatter of compressed segments); rank j decodes and sums the P
  payloads of its segment, compresses the sum again with its own state (a second, per-segment
  error-feedback residual where the compressor keeps one, as 1-bit Adam's compressed allreduce),
  and the compressed sums are all-gathered and decoded. 2(P-1)/P · B bytes per rank: flat in P.
  The price: a second compression of the sum (more error unless error feedback catches it) and
  one more latency-bound round. ``auto`` takes it for P >= 3, where it sends fewer bytes than
  the allgather ((P-1) · B; at P = 2 both send B), for each tensor whose measured segment
  payloads keep it so (per-segment scales and padding make it lose on tiny tensors).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from ..contract.compressor import Compressor, TensorInfo
from ..ops.facade import Tensor

#: The collectives a round's payloads travel by, in the order one round launches them: summable
#: payloads by allreduce, per-rank payloads by allgather or by the compressed allreduce's
#: all-to-all. A new collective is added here, in :class:`Collectives` and in its adapters.
WIRE_COLLECTIVES = ("allreduce", "allgather", "alltoall")
#: How per-rank payloads may travel: each tensor's choice (``choose_collective``, the cost model)
PAYLOAD_COLLECTIVES = WIRE_COLLECTIVES[1:]
#: The ``collective=`` argument of every front end: 'auto' or one of the above
COLLECTIVES = ("auto", *PAYLOAD_COLLECTIVES)


class Collectives(ABC):
    """Horovod's collectives over one process set, as a framework supplies them.

    Each call starts one grouped collective and returns a handle; :meth:`wait` returns its
    outputs in input order. A synchronous adapter may return the outputs as the handle.
    """

    world: int
    rank: int

    @abstractmethod
    def allreduce(self, tensors: list, tag: str) -> Any:
        """Sum over ranks of each tensor."""

    @abstractmethod
    def allgather(self, tensors: list, tag: str) -> Any:
        """Each tensor concatenated over ranks along its first dimension, in rank order."""

    @abstractmethod
    def alltoall(self, tensors: list, tag: str) -> Any:
        """Each tensor cut into ``world`` equal parts, part j sent to rank j; the output is the
        concatenation of the parts received, in rank order."""

    @abstractmethod
    def wait(self, handle: Any) -> list:
        """The outputs of a started collective."""

    def pairs_take_turns(self, on_gpu: bool) -> bool:
        """Whether the two directions of a pairwise exchange take turns on this transport for
        tensors on a GPU (``on_gpu``) or the CPU: Gloo's TCP pairs do (the cost model's
        :attr:`hvdcompress.plan.links.Link.half_duplex_pairs`); NCCL and MPI overlap them."""
        return False


def wire_bytes(collective: str, payload: int, world: int) -> float:
    """Bytes one rank puts on its link for one payload of ``payload`` bytes (ring algorithms);
    for ``alltoall``, ``payload`` is the whole tensor's compressed size."""
    if world <= 1:
        return 0.0
    if collective == "allgather":
        return (world - 1) * payload
    return 2 * (world - 1) / world * payload


def check_collective(collective: str, compressor: Compressor) -> str:
    """Validate the ``collective`` argument of the framework wrappers."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective={collective!r}: allowed: {', '.join(map(repr, COLLECTIVES))}")
    if collective == "alltoall" and not compressor.supports_alltoall:
        raise ValueError(f"collective='alltoall' with {compressor!r}: the compressed allreduce needs "
                         "per-rank payloads of a size fixed by the tensor's and that can be decoded, "
                         "summed and compressed again (the quantisers, int8, bf16); this compressor's "
                         "are summable (allreduce already sends 2(P-1)/P of them), vary in size "
                         "(sparsifiers), span several rounds (PowerSGD) or are votes (signum); "
                         "use collective='auto' or 'allgather'")
    return collective


def choose_collective(collective: str, compressor: Compressor, world: int) -> str:
    """'alltoall' or 'allgather' for a tensor's per-rank payloads (summable ones always go
    through allreduce); the same on every rank. See the module doc for the cost model."""
    if collective != "auto":
        return collective
    return "alltoall" if compressor.supports_alltoall and world >= 3 else "allgather"


class Planner(ABC):
    """A compressor that picks each tensor's collective itself (``compression="auto"``,
    :class:`hvdcompress.auto.Auto`): the engine asks it instead of :func:`choose_collective`,
    handing over itself, and tells it when each step ends.

    ``engine``: the :class:`hvdcompress.engines.exchange.Exchange` asking (not imported here: the
    engine imports this module); a planner may read its ``comm`` (:class:`Collectives`),
    ``ops`` (:class:`hvdcompress.ops.facade.Ops`), ``busy_s`` (the seconds this rank spent in it)
    and ``plan`` (tensor name -> (numel, collective, payload bytes, wire bytes))."""

    @abstractmethod
    def collective_of(self, info: TensorInfo, engine: Any, like: Tensor) -> str:
        """'allreduce', 'allgather' or 'alltoall' for this tensor (the same on every rank);
        ``like``: a tensor on the gradient's device."""

    @abstractmethod
    def after_step(self, engine: Any) -> None:
        """The step has ended on this rank (every rank calls it once per step)."""

