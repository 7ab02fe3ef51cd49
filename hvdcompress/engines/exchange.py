"""The exchange engine: compress a group of gradients, run their collectives, decode, scale.

One engine for every framework (no framework import here). A framework wrapper supplies
:class:`Collectives` (Horovod's ops over one process set: torch's async grouped ops, TF's ops
inside the exchange's ``py_function``, or the in-process simulator of the tests) and the
per-tensor state dicts; it keeps only what is its own (hooks, variables, IndexedSlices,
checkpoints). One step for a group of tensors::

    entries = [engine.compress(key, x, state, info) for each tensor]   # ctx stays on the rank
    flight = engine.start(entries)           # launch round 0 of every entry (non-blocking)
    for entry in engine.finish(flight, out_of): entry.total           # wait, resume, decode, scale

The collective of each tensor is :func:`hvdcompress.transport.collectives.choose_collective`'s (the cost
model of each collective is in :mod:`hvdcompress.transport.collectives`).

A :class:`Planner` compressor (``compression="auto"``, :mod:`hvdcompress.auto`) picks each
tensor's compressor and collective itself; :attr:`Exchange.busy_s` counts the seconds a rank
spends in the engine, which it compares with its prediction.

Each multi-round algorithm (PowerSGD, CSC) keeps its rounds in :attr:`Packet.resume`; the
engine runs them in turn; the two-level composer (:mod:`hvdcompress.engines.two_level`) runs the
compressed allreduce's two halves apart (:meth:`Exchange.arrivals`, ``_segment_sum``,
``_share_segment``) around another engine's exchange between nodes. The result of each entry is the sum over ranks of what their
payloads stand for, times ``scale`` (predivide / P for an average).
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import MutableMapping
from typing import Any, Callable, Optional

from ..contract.compressor import Compressor, Packet, TensorInfo, payload_bytes
from ..ops.facade import Ops, Tensor
from ..state.prefixed import PrefixedState
from ..transport.collectives import (
    WIRE_COLLECTIVES,
    Collectives,
    Planner,
    check_collective,
    choose_collective,
    wire_bytes,
)
from ..transport.rounds import Entry, Round, Send, launch_alltoall, wait
from .accounting import ByteCount
from .contract import Engine
from .segments import side_by_side, summed_segment

log = logging.getLogger("hvdcompress")
DENSE = "dense"   # the ctx of a packet sent as it is (TensorInfo.dense)


def _busy(method: Callable) -> Callable:
    """Add the seconds spent in ``method`` to :attr:`Exchange.busy_s` (the outermost call only:
    :meth:`Exchange.finish` recurses, :meth:`Exchange.compress` is called by wrappers' hooks)."""
    @functools.wraps(method)
    def timed(self: "Exchange", *args: Any, **kwargs: Any) -> Any:
        if self._timing:
            return method(self, *args, **kwargs)
        self._timing, begin = True, time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._timing = False
            self.busy_s += time.perf_counter() - begin
    return timed


class Exchange(Engine):
    """Compress, communicate, decode and scale the gradients of one wrapper.

    ``average``: divide the sum by the number of ranks (op=Average), after multiplying it back
    by ``predivide`` (Horovod's gradient_predivide_factor; the inputs are divided by it first).
    ``collective``: 'auto', 'allgather' or 'alltoall' for per-rank payloads (see module doc).
    """

    #: Whether a segment of the compressed allreduce may be a summable packet (decoded and summed
    #: like any other): no for the flat exchange, where summable payloads take the allreduce;
    #: yes for the intra-node level of :class:`hvdcompress.engines.two_level.TwoLevel` (fp16).
    summable_segments: bool = False
    #: Whether :attr:`TensorInfo.dense` sends the tensor as it is (allreduce): yes for a flat
    #: exchange; the two-level node level always reduce-scatters (its cross level honours it).
    honours_dense: bool = True

    def __init__(self, compressor: Compressor, ops: Ops, comm: Collectives, average: bool = True,
                 predivide: float = 1.0, collective: str = "auto", log_plan: bool = True):
        self.compressor = compressor
        self.ops = ops
        self.comm = comm
        self.average = average
        self.predivide = predivide
        self.collective = check_collective(collective, compressor)
        self.step_bytes = ByteCount(steps=1)
        self.last_step_bytes = ByteCount()
        self.total_bytes = ByteCount()
        self.plan: dict = {}   # tensor name -> (numel, collective, payload bytes, wire bytes)
        self._logged = not log_plan   # log_plan=False: an engine that logs this one's plan
        self._auto: dict = {}  # tensor name -> the collective 'auto' measured for it
        self.busy_s = 0.0      # seconds this rank spent compressing, launching, waiting, decoding
        self._timing = False

    @property
    def ranks(self) -> int:
        """The number of ranks whose gradients are summed (the average's divisor)."""
        return self.comm.world

    @property
    def scale(self) -> float:
        return self.predivide / self.ranks if self.average else 1.0

    # ---- compress ------------------------------------------------------------------------------
    def collective_for(self, info: TensorInfo, like: Tensor) -> str:
        """The collective this tensor's per-rank payloads take (same on every rank: payload
        sizes depend only on the tensor's size). With ``auto``, the compressed allreduce only
        where its measured payloads put fewer bytes on the link than the allgather's: each of
        its P segments carries its own scale or bounds and a tensor is padded to P segments, so
        on tiny tensors (biases) it loses. Decided once per tensor (:meth:`_cheaper`). A
        :class:`Planner` compressor decides itself."""
        if isinstance(self.compressor, Planner):
            return self.compressor.collective_of(info, self, like)
        choice = choose_collective(self.collective, self.compressor, self.comm.world)
        if choice != "alltoall" or self.collective == "alltoall":
            return choice
        if info.name not in self._auto:
            self._auto[info.name] = self._cheaper(info, like)
        return self._auto[info.name]

    def _cheaper(self, info: TensorInfo, like: Tensor) -> str:
        """'alltoall' or 'allgather', whichever sends fewer bytes for this tensor's size, from one
        trial compression of zeros of each shape (the algorithm under any decorators, with a
        throwaway state: decorators do not change payload sizes)."""
        world, algorithm = self.comm.world, self.compressor.unwrap()
        length = -(-info.numel // world)

        def payload(seg_info: TensorInfo) -> int:
            zeros, state = self.ops.zeros(seg_info.numel, like=like), {}
            algorithm.init_state(self.ops, zeros, state, seg_info)
            return payload_bytes(self.ops, algorithm.compress(self.ops, zeros, state, seg_info).tensors)

        segments = world * payload(self._segment_info(info, 0, length))
        whole = payload(info)
        return "alltoall" if wire_bytes("alltoall", segments, world) < wire_bytes("allgather", whole, world) \
            else "allgather"

    def init_state(self, x: Tensor, state: MutableMapping, info: TensorInfo) -> None:
        """Create the tensor's compressor state (and its segments' for the compressed allreduce)."""
        if info.numel == 0:
            return
        if self.collective_for(info, x) != "alltoall":
            self.compressor.init_state(self.ops, x, state, info)
            return
        length = -(-info.numel // self.comm.world)
        like = self.ops.zeros(length, like=x)
        for j in range(self.comm.world):
            self.compressor.init_state(self.ops, like, PrefixedState(state, f"seg{j}."),
                                       self._segment_info(info, j, length))
        server = self.compressor.server_side()
        me = self.comm.rank
        server.init_state(self.ops, like, PrefixedState(state, "sum."), self._segment_info(info, me, length, "sum"))

    @_busy
    def compress(self, key: Any, x: Tensor, state: MutableMapping, info: TensorInfo) -> Entry:
        """Compress the flat gradient ``x`` of one tensor (already divided by ``predivide``)."""
        entry = Entry(key, info, state)
        dense = info.numel * self.ops.element_size(x)
        if info.numel == 0:
            entry.packet = Packet([], None, summable=True)
            return entry
        self.init_state(x, state, info)
        entry.collective = self.collective_for(info, x)
        if info.dense and self.honours_dense:
            entry.packet, entry.collective = Packet([x], DENSE, summable=True), "allreduce"
        elif entry.collective == "alltoall":
            length = -(-info.numel // self.comm.world)
            params = self.segments(info.param, info.numel, self.comm.world) \
                if info.param is not None and self.compressor.takes_over_momentum else None
            packets = []
            for j, seg in enumerate(self.segments(x, info.numel, self.comm.world)):
                seg_info = self._segment_info(info, j, length)
                seg_info.param = None if params is None else params[j]  # weight decay per segment
                packets.append(self.compressor.compress(self.ops, seg, PrefixedState(state, f"seg{j}."), seg_info))
                entry.segments.append((packets[-1].ctx, seg_info))
            if any(p.resume is not None or (p.summable and not self.summable_segments) for p in packets):
                raise RuntimeError(f"{self.compressor!r} claims supports_alltoall but produced a "
                                   "summable or multi-round packet")
            entry.packet = Packet(side_by_side(self.ops, [p.tensors for p in packets]), None)
        else:
            entry.packet = self.compressor.compress(self.ops, x, state, info)
            if entry.packet.summable:
                entry.collective = "allreduce"
        sent = payload_bytes(self.ops, entry.packet.tensors)
        self.step_bytes.add(dense, sent)
        self.plan[info.name] = (info.numel, entry.collective, sent,  # the latest step's
                                wire_bytes(entry.collective, sent, self.comm.world))
        return entry

    def segments(self, x: Tensor, numel: int, parts: int) -> list:
        """``x`` (``numel`` elements) zero-padded to a multiple of ``parts`` and cut into
        ``parts`` equal segments."""
        length = -(-numel // parts)
        padded = x if length * parts == numel else \
            self.ops.concat([x, self.ops.zeros(length * parts - numel, like=x)])
        return self.ops.split(padded, [length] * parts)

    @staticmethod
    def _segment_info(info: TensorInfo, j: int, length: int, role: str = "seg") -> TensorInfo:
        """A segment's info; its shape is (rows, row) when it holds whole rows of the tensor
        (per-row scales, ``OneBit(chunk="rows")``), else (length,)."""
        row = info.numel // info.shape[0] if len(info.shape) >= 2 and info.shape[0] else 0
        shape = (length // row, row) if row and length % row == 0 else (length,)
        return TensorInfo(name=f"{info.name}#{role}{j}", numel=length, world=info.world, dense=info.dense,
                          mild=info.mild, shape=shape, rank=info.rank, momentum=info.momentum,
                          nesterov=info.nesterov, weight_decay=info.weight_decay)

    # ---- communicate ---------------------------------------------------------------------------
    @_busy
    def start(self, entries: list, number: int = 0) -> Round:
        """Launch round ``number`` of ``entries`` (one grouped call per collective)."""
        sends = [Send(e, e.packet.tensors, e.collective) for e in entries if e.info.numel]
        return self._launch(sends, number, entries[0].info.name if entries else "empty")

    def _launch(self, sends: list, number: int, label: str) -> Round:
        """One grouped call per collective, in :data:`WIRE_COLLECTIVES`' order (the same on every
        rank, so synchronous adapters such as TF's call them in the same order)."""
        handles = {}
        for collective in WIRE_COLLECTIVES:
            tensors = [t for s in sends if s.collective == collective for t in s.tensors]
            if tensors:
                tag = f"hvdc.{label}.r{number}.{collective}"
                handles[collective] = launch_alltoall(self.ops, self.comm, tensors, tag) \
                    if collective == "alltoall" else getattr(self.comm, collective)(tensors, tag)
        return Round(sends, handles, number)

    @_busy
    def finish(self, flight: Round, out_of: Callable[[Entry], Optional[Tensor]] = lambda e: None) -> list:
        """Wait for a round, run the following rounds, decode every entry into
        ``out_of(entry)`` (a flat buffer to decode into, or None), scale it; return the entries."""
        follow = []
        for send, received in self.arrivals(flight):
            nxt = (send.then or self.after_round)(send.entry, received, send.collective, out_of)
            if nxt is not None:
                follow.append(nxt)
        if follow:
            self.finish(self._launch(follow, flight.number + 1, follow[0].entry.info.name), out_of)
        return [s.entry for s in flight.sends]

    def arrivals(self, flight: Round) -> list:
        """Wait for a round: each send with what came back for it, ``(send, received)``, in
        the round's order."""
        outputs = {collective: iter(wait(self.ops, self.comm, h)) for collective, h in flight.handles.items()}
        arrived = []
        for send in flight.sends:
            stream = outputs[send.collective]
            arrived.append((send, [next(stream) for _ in send.tensors]))
        return arrived

    def after_round(self, entry: Entry, received: list, collective: str, out_of) -> Optional[Send]:
        """What follows a round of an entry: its next send, or its decoded total (None).
        ``received``: the round's outputs for the entry; ``out_of(entry)``: the buffer to decode
        into (or None). A composing engine (two-level) runs another engine's rounds with it."""
        packet, info = entry.packet, entry.info
        if collective == "alltoall":
            return self._reduce_segment(entry, received)
        if packet.resume is not None:
            entry.packet = packet.resume(received)
            self.step_bytes.add(0, payload_bytes(self.ops, entry.packet.tensors))
            return Send(entry, entry.packet.tensors, "allreduce" if entry.packet.summable else "allgather")
        out = out_of(entry)
        if packet.ctx is DENSE:
            total = self.ops.into(out, received[0])
        elif packet.summable:
            total = self.compressor.decompress(self.ops, received, packet.ctx, info, out=out)
        else:
            total = self.compressor.decompress_gathered(self.ops, received, packet.ctx, info,
                                                        self.comm.world, out=out)
        entry.total = self._scaled(total)
        return None

    def _reduce_segment(self, entry: Entry, received: list) -> Send:
        """Compressed allreduce, middle: decode and sum this rank's segment from every rank,
        compress the sum again (own state), and send it to every rank (allgather)."""
        return self._share_segment(entry, self._segment_sum(entry, received))

    def _segment_sum(self, entry: Entry, received: list) -> Tensor:
        """The sum over ranks of this rank's segment, decoded from the all-to-all's payloads."""
        ctx, seg_info = entry.segments[self.comm.rank]
        return summed_segment(self.compressor, self.ops, received, [(ctx, seg_info, received)], self.comm.world)

    def _share_segment(self, entry: Entry, seg_sum: Tensor) -> Send:
        """Compress this rank's reduced segment again (the server side's own state, ``sum.``)
        and all-gather it; the last step decodes every segment into the entry's total, scaled."""
        me = self.comm.rank
        length = self.ops.numel(seg_sum)
        server = self.compressor.server_side()
        sum_info = self._segment_info(entry.info, me, length, "sum")
        packet = server.compress(self.ops, seg_sum, PrefixedState(entry.state, "sum."), sum_info)
        self.step_bytes.add(0, payload_bytes(self.ops, packet.tensors))

        def assemble(entry: Entry, gathered: list, collective: str, out_of) -> None:
            pieces = [self.ops.split(t, [self.ops.numel(t) // self.comm.world] * self.comm.world)
                      for t in gathered]
            decoded = [server.decompress(self.ops, [p[j] for p in pieces], packet.ctx,
                                         self._segment_info(entry.info, j, length, "sum"))
                       for j in range(self.comm.world)]
            flat = self.ops.concat(decoded)
            if self.ops.numel(flat) != entry.info.numel:
                flat = self.ops.split(flat, [entry.info.numel, self.ops.numel(flat) - entry.info.numel])[0]
            entry.total = self._scaled(self.ops.into(out_of(entry), flat))
            return None

        return Send(entry, packet.tensors, "allgather", assemble)

    def _scaled(self, total: Tensor) -> Tensor:
        return total if self.scale == 1.0 else self.ops.scale_(total, self.scale)

    # ---- step bookkeeping ----------------------------------------------------------------------
    def end_step(self) -> None:
        """Close the step's byte count; log the collective plan once (rank 0)."""
        self.last_step_bytes = self.step_bytes
        self.total_bytes.merge(self.step_bytes)
        self.step_bytes = ByteCount(steps=1)
        if not self._logged and self.plan:
            self._logged = True
            if self._logs_plan():
                log.info("hvdcompress exchange plan (P=%d, %s):\n%s", self.ranks,
                         self.describe(), self.plan_table())
        if isinstance(self.compressor, Planner):
            self.compressor.after_step(self)

    def describe(self) -> str:
        """The compression, in words, for the plan's log line."""
        return self.compressor.name

    def _logs_plan(self) -> bool:
        """Whether this rank logs the plan: rank 0 of the exchange."""
        return self.comm.rank == 0

    def plan_table(self) -> str:
        """The collective chosen for each tensor, with payload and per-rank wire bytes."""
        rows = ["tensor | numel | collective | payload B | wire B/rank | dense wire B/rank"]
        for name, (numel, collective, sent, wire) in sorted(self.plan.items()):
            dense = wire_bytes("allreduce", 4 * numel, self.ranks)
            rows.append(f"{name} | {numel} | {collective} | {sent} | {wire:.0f} | {dense:.0f}")
        return "\n".join(rows)
