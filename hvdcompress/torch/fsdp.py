"""Sharded data parallelism (FSDP) with compression: a compressed reduce-scatter, stateful.

FSDP1 (``FullyShardedDataParallel``, FULL_SHARD or SHARD_GRAD_OP)::

    from hvdcompress.torch import fsdp
    model = FSDP(net, sharding_strategy=ShardingStrategy.FULL_SHARD)
    model.register_comm_hook(fsdp.CompressionState(compression=Int8()), fsdp.reduce_scatter_hook)

FSDP2 (``fully_shard``)::

    fully_shard(layer) for each layer; fully_shard(model)
    state = fsdp.compress(model, compression=ErrorFeedback(OneBit()))

A front end of the step driver (:mod:`hvdcompress.step.driver`): each FSDP unit's flat gradient
goes through :class:`hvdcompress.engines.reduce_scatter.ReduceScatterExchange`, then is divided as
FSDP would (FSDP1: the hook averages; FSDP2: ``op`` AVG or SUM, FSDP's pre/post factors around
it). Which compressors fit: :func:`hvdcompress.engines.reduce_scatter.check_sharded`.

Units are named by FSDP2's module paths (``compress``), or for FSDP1, whose hook is not told
which unit it reduces, ``unit<k>`` in the order of the backward pass (the same on every rank and
every step of one model). The step (bytes, the compressor's counters) ends with the backward
pass. NO_SHARD calls ``hook(state, grad)``: the same reduce-scatter, then an all-gather of the
decoded shards (dense, in the gradient's dtype: the second half is not compressed). Hybrid
strategies refuse communication hooks in FSDP itself (:func:`compress` names the FSDP2 route).

HSDP (FSDP2 on a ``("replicate", "shard")`` mesh): :func:`compress` compresses the all-reduce
across replicas instead, with the take-overs (``optimizer=``), and leaves the reduce-scatter
inside the node to FSDP, or with ``intra_node=`` compresses it too (:mod:`hvdcompress.torch.hsdp`,
:mod:`hvdcompress.torch.hsdp_in_node`). ``all_gather=`` (FSDP2 FULL_SHARD): the
parameters' all-gather quantised too, master weights exact (:mod:`hvdcompress.torch.fsdp_gather`).

``check_replicas``: the sharded parameters are not replicas (each rank holds its own shard), so
what is compared across ranks is the compressor's step counters, every N-th step. Checkpoints:
:meth:`CompressionState.state_dict` (``gather=True``: every rank's), resumed at the same world
size bit for bit, or at another one with each unit's unsent error-feedback mass pooled and
shared (:mod:`hvdcompress.state.reshard`'s rule; laid out at the unit's first reduce-scatter).
"""
from typing import Any, Mapping, Optional, Union

import numpy as np
import torch
import torch.distributed as dist

from ..contract.compressor import Compressor, TensorInfo
from ..engines.accounting import ByteCount
from ..engines.reduce_scatter import (
    check_sharded,
    laid_out,
    pooled_units,
)
from ..engines.selection import select_engine
from ..state import store as state_store
from ..step.driver import StepDriver
from ..step.frontend import FrontEnd
from ..step.options import parse_options
from . import fsdp_gather, fsdp_reduce_scatter, hsdp
from .dist_collectives import DistCollectives, node_collectives, whole_group
from .grad_scaler import enabled_scaler, scaler_link
from .tensors import CONVERSIONS, OPS

__all__ = ["CompressionState", "reduce_scatter_hook", "compress"]


class CompressionState(FrontEnd):
    """The state of :func:`reduce_scatter_hook` and of :func:`compress`'s reduce-scatters: the
    compressor, its state per unit, chunk and block, and the driver. May be built before
    ``init_process_group`` (nothing collective runs until the first reduce-scatter).

    ``compression``: a compressor or a dict for :func:`hvdcompress.from_params` that fits the
    sharded form (:func:`~hvdcompress.engines.reduce_scatter.check_sharded`); ``process_group``: the
    group FSDP shards over (None: the default group); ``block``: elements per compressed block
    (:mod:`hvdcompress.engines.reduce_scatter`: one scale or selection per block); ``check_replicas``:
    compare the compressor's counters every N steps. ``intra_node`` / ``ranks_per_node``: the
    two-level reduce-scatter (:class:`~hvdcompress.engines.two_level.TwoLevel`: ``intra_node``
    a mild compressor inside the node, ``compression`` between nodes; default group only; the node
    groups of :func:`hvdcompress.torch.ddp.node_groups`). ``total_bytes`` / ``last_step_bytes``:
    this rank's dense versus sent gradient bytes (:class:`~hvdcompress.engines.accounting.ByteCount`);
    ``total_bytes`` adds ``all_gather_bytes``, the parameters' (:mod:`hvdcompress.torch.fsdp_gather`).
    ``scaler`` (with ``optimizer``, which it steps): each unit's gradient unscaled before compression;
    an overflow on any rank puts the state back and skips the step everywhere (step.loss_scale).
    """

    def __init__(self, process_group: Optional[Any] = None,
                 compression: Union[Compressor, Mapping, None] = None, block: int = 4096,
                 check_replicas: Optional[int] = None, intra_node: Union[Compressor, Mapping, None] = None,
                 ranks_per_node: Optional[int] = None, scaler: Optional[torch.amp.GradScaler] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None):
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"block={block!r}: allowed: an integer >= 1 (elements per compressed block)")
        self.options = parse_options(compression, op="average", average_op="average", sum_op="sum",
                                     check_replicas=check_replicas, intra_node=intra_node,
                                     ranks_per_node=ranks_per_node, scaler=enabled_scaler(scaler),
                                     scaler_types=(torch.amp.GradScaler,), **whole_group(process_group))
        self.compressor = check_sharded(self.options.compressor)
        self.process_group = process_group
        self.block = block
        super().__init__(StepDriver(self.options, OPS, self._engine, lambda: DistCollectives(process_group),
                                    "hvdcompress.torch.fsdp.CompressionState"))
        self.driver.describe([("block", (block,), "")])   # units are known at their reduce-scatter only
        self._units = 0          # FSDP1: units reduced so far in this backward pass
        self._open = False       # a step (backward pass) is under way
        self._pending: dict = {}   # unit -> its pooled state from a checkpoint at another world size
        self._io: dict = {}        # unit -> (flat gradient, output shard, scale) of this step
        self.all_gather_bytes = ByteCount()   # compress(all_gather=): the parameters' all-gathers
        self.scaler = scaler_link(self.options.scaler, optimizer)
        self.driver.guard = None if self.scaler is None else self.scaler.guard

    comm = property(lambda self: self.driver.comm)

    def _engine(self) -> Any:
        intra = self.options.intra_node
        return select_engine(self.compressor, OPS, self.driver.comm, intra_node=intra, sharded=True, block=self.block,
                             node_comms=lambda: node_collectives(self.options.ranks_per_node))

    last_step_bytes = property(lambda self: self.driver.last_step_bytes,
                               doc="this rank's dense versus sent bytes of the last step")
    total_bytes = property(lambda self: self.driver.total_bytes.plus(self.all_gather_bytes),
                           doc="this rank's dense versus sent bytes since construction (gradients, parameters)")

    @property
    def cross_node_bytes(self) -> ByteCount:
        """This rank's bytes to other nodes since construction against FSDP's own there, with
        ``intra_node=`` only (:meth:`~hvdcompress.engines.two_level.TwoLevel.cross_node_bytes`)."""
        if self.options.intra_node is None:
            raise ValueError("cross_node_bytes: nodes are known with fsdp.compress(..., intra_node=...) only")
        return self.driver.engine.cross_node_bytes(self.all_gather_bytes) if self.driver.built else ByteCount()

    def reduce_scatter(self, name: str, grad: torch.Tensor, output: torch.Tensor, scale: float) -> None:
        """Unit ``name``'s flat gradient ``grad`` (P·L elements) reduce-scattered through the
        compressor into ``output`` (this rank's L elements), multiplied by ``scale``."""
        driver = self.driver
        if not self._open:
            self._begin()
        if grad.numel() != output.numel() * driver.comm.world:
            raise ValueError(f"unit '{name}': a gradient of {grad.numel()} elements and a shard of "
                             f"{output.numel()}: the group has {driver.comm.world} ranks")
        state = driver.states.tensor(name)
        if name in self._pending:
            state.update({k: torch.from_numpy(v).to(grad.device) if isinstance(v, np.ndarray) else v
                          for k, v in laid_out(self._pending.pop(name), grad.numel(), driver.comm.world,
                                               self.block).items()})
        self._io[name] = (grad.reshape(-1), output, scale)
        self.ready([name])
        self.drain()   # FSDP waits for its reduce-scatter

    # ---- the front-end contract (hvdcompress.step.frontend): keys are unit names -----------------
    def name(self, unit: str) -> str:
        return unit

    def gradient(self, unit: str) -> torch.Tensor:
        return self._io[unit][0]

    def info(self, unit: str) -> TensorInfo:
        x = self._io[unit][0]
        return TensorInfo(name=unit, numel=x.numel(), world=self.comm.world, rank=self.comm.rank, shape=(x.numel(),))

    def unscale(self, unit: str) -> None:
        self.scaler.unscale_tensor(self._io[unit][0])

    def out_of(self, entry: Any) -> torch.Tensor:
        return self._io[entry.key][1].reshape(-1)

    def write(self, entry: Any) -> None:
        _, output, scale = self._io[entry.key]
        if scale != 1.0:
            output.mul_(scale)

    def clip_local(self, units: list, scale: float) -> None:
        raise AssertionError("FULL_SHARD takes no clip_grad_norm")   # never: its options have none

    def clip_mean(self, units: list) -> Any:
        raise AssertionError("FULL_SHARD takes no clip_grad_norm")

    def _begin(self) -> None:
        """The step's first reduce-scatter: the rank agreement (once), the counters' check, and
        the step's end queued at the end of the backward pass."""
        self._open = True
        self.driver.agree(None, torch.zeros(1, device=self._device()))
        self.driver.check_replicas(lambda: [("compressor counters", torch.zeros(1))])
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self.end_step)
        except RuntimeError:   # not inside a backward pass: the caller ends the step (end_step)
            pass

    def end_step(self) -> None:
        """Close the step: bytes counted, the compressor's counters advanced (at the end of the
        backward pass by itself; call it after a reduce-scatter run outside one)."""
        if self._open:
            self._open, self._units = False, 0
            self.updated(self.wait())   # the overflow flags, the bytes, the counters
            self._io.clear()

    def _device(self) -> torch.device:
        backend = dist.get_backend(self.process_group)
        return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    # ---- FSDP1's hook ------------------------------------------------------------------------------
    def hook(self, grad: torch.Tensor, output: Optional[torch.Tensor]) -> None:
        name = f"unit{self._units}"
        self._units += 1
        world = self.comm.world
        if output is not None:
            self.reduce_scatter(name, grad, output, 1.0 / world)
            return
        flat = grad.reshape(-1)   # NO_SHARD: the reduce-scatter, then the dense shards all-gathered
        length = -(-flat.numel() // world)
        padded = torch.cat([flat, flat.new_zeros(length * world - flat.numel())]) if length * world != flat.numel() else flat
        shard = flat.new_empty(length)
        self.reduce_scatter(name, padded, shard, 1.0 / world)
        gathered = flat.new_empty(length * world)
        dist.all_gather_into_tensor(gathered, shard, group=self.process_group)
        self.driver.engine.step_bytes.add(0, shard.numel() * shard.element_size())
        flat.copy_(gathered[:flat.numel()])

    # ---- checkpoints -------------------------------------------------------------------------------
    def state_dict(self, gather: bool = False) -> dict:
        """The compressor's state and every unit's buffers (keys ``c<chunk>.b<block>.<entry>``):
        this rank's, or with ``gather=True`` every rank's (a collective)."""
        return state_store.save(self.driver, CONVERSIONS, gather, torch.zeros(1, device=self._device()))

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Restore :meth:`state_dict`'s output: one rank's at the same world size; a gathered
        one at the same world size (each rank its own, bit for bit) or at another (each unit's
        per-rank mass pooled and shared, laid out at its first reduce-scatter). Local. All or
        nothing: the whole state is checked first (:func:`hvdcompress.state.store.check`; units
        are known at their reduce-scatter only, so their names and sizes are not), every state
        built, then assigned; a refused one (a ``ValueError``) changes nothing."""
        state_store.check(self.driver, state_dict, CONVERSIONS, None, None)
        world, rank = self.comm.world, self.comm.rank
        saved_world = state_dict.get("world", world)
        if "ranks" not in state_dict and saved_world != world:
            raise ValueError(f"load_state_dict: this checkpoint holds one rank's compressor state of a "
                             f"run at {saved_world} ranks, and this run has {world}; save it with "
                             "state_dict(gather=True) to resume at another world size")
        if saved_world != world and self.options.intra_node is not None:
            raise ValueError("load_state_dict: a two-level state (intra_node=) resumes at the same world size only")
        if "ranks" not in state_dict or saved_world == world:
            mine = state_dict["tensors"] if "ranks" not in state_dict else state_dict["ranks"][rank]
            states, pending = state_store.cloned(mine, CONVERSIONS), {}
        else:
            states, pending = {}, pooled_units([{n: {k: CONVERSIONS.to_numpy(v) if torch.is_tensor(v) else v
                                                     for k, v in st.items()} for n, st in r.items()}
                                                for r in state_dict["ranks"]], self.options.average)
        self.compressor.load_state_dict(state_dict["compressor"])
        self.driver.states.clear()
        self.driver.states.update(states)
        self._pending = pending


def reduce_scatter_hook(state: CompressionState, grad: torch.Tensor, output: Optional[torch.Tensor] = None) -> None:
    """FSDP1 communication hook (``model.register_comm_hook(state, reduce_scatter_hook)`` on the root,
    before the first forward): the unit's padded flat gradient into its shard (NO_SHARD: in place)."""
    state.hook(grad, output)


def compress(module: torch.nn.Module, compression: Union[Compressor, Mapping, None] = None,
             process_group: Optional[Any] = None, block: int = 4096, check_replicas: Optional[int] = None,
             intra_node: Union[Compressor, Mapping, None] = None, ranks_per_node: Optional[int] = None,
             optimizer: Optional[torch.optim.Optimizer] = None,
             collective: str = "auto", all_gather: Union[Compressor, Mapping, None] = None,
             scaler: Optional[torch.amp.GradScaler] = None, clip_grad_norm: Optional[float] = None
             ) -> Union[CompressionState, hsdp.HSDPState]:
    """Install a compressed reduce-scatter on every ``FSDPModule`` under ``module`` (``fully_shard``
    applied first); return their shared :class:`CompressionState` (arguments as its).

    HSDP (``fully_shard`` on a ``("replicate", "shard")`` mesh): the all-reduce across replicas
    compressed instead (:mod:`hvdcompress.torch.hsdp`: ``compression``, ``optimizer``, ``collective``
    and ``check_replicas`` as the DDP hook's); FSDP's reduce-scatter left dense, or compressed with
    ``intra_node=`` over the shard dimension (with ``block``; :mod:`hvdcompress.torch.hsdp_in_node`).
    ``all_gather``: Int8() or Int4() quantises FULL_SHARD's parameter all-gathers (module doc).
    ``scaler``: a ``torch.amp.GradScaler``, with ``optimizer`` (the one it steps), on both;
    ``clip_grad_norm``: HSDP's (clipped as the DDP hook clips, on each replica's whole gradient)."""
    hsdp.refuse_hybrid_shard(module)
    if hsdp.is_hsdp(module):
        given = {"process_group": process_group, "ranks_per_node": ranks_per_node, "all_gather": all_gather}
        if any(v is not None for v in given.values()) or (block != 4096 and intra_node is None):
            raise ValueError(f"compress: {given} / block={block} with HSDP: the replicate all-reduce runs over "
                             "the mesh's replicate group as a flat exchange; leave them at their defaults "
                             "(block= is intra_node='s)")
        in_node = None if intra_node is None else (lambda group: CompressionState(group, intra_node, block))
        return hsdp.compress(module, compression, optimizer, collective, check_replicas, scaler, clip_grad_norm,
                             in_node)
    if clip_grad_norm is not None:
        raise ValueError(f"compress: clip_grad_norm={clip_grad_norm!r} is HSDP's: under FULL_SHARD no rank sees the "
                         "whole gradient before the first unit's reduce-scatter; clip the exchanged shards with "
                         "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) before optimizer.step()")
    if (optimizer is not None and scaler is None) or collective != "auto":
        raise ValueError("compress: optimizer= and collective= are HSDP's (the replicate all-reduce); the "
                         "compressed reduce-scatter of FULL_SHARD takes optimizer= only with scaler=")
    gather_codec = fsdp_gather.codec(module, all_gather)
    units = fsdp_reduce_scatter.units(module)
    if not units:
        raise ValueError(f"compress: no FSDPModule under {type(module).__name__}; apply "
                         "torch.distributed.fsdp.fully_shard to it (and its layers) first")
    state = CompressionState(process_group, compression, block, check_replicas, intra_node, ranks_per_node,
                             scaler, optimizer)
    fsdp_reduce_scatter.install(units, state)
    fsdp_gather.install(units, gather_codec, state.all_gather_bytes)
    return state

