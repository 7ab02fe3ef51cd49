"""HSDP (FSDP2 over a ``("replicate", "shard")`` mesh) with the all-reduce across replicas compressed.

::

    mesh = init_device_mesh("cuda", (nodes, ranks_per_node), mesh_dim_names=("replicate", "shard"))
    fully_shard(layer, mesh=mesh) for each layer; fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), betas=(0.9, 0.95))
    state = fsdp.compress(model, compression={"compressor": "onebit", "ef": "vanilla", "adam": "frozen"},
                          optimizer=opt)

The rule: FSDP reduce-scatters each unit's gradient over the shard dimension (inside a node) and
averages it over the S shard ranks; rank (r, j) then holds shard j of replica r's mean gradient,
and the R ranks holding shard j (one per replica, across nodes) need its mean over the replicas::

    g_j = 1/R · Σ_r (1/S · Σ_s g_{r,s})[j]

That is data parallelism over R replicas on a flat tensor (each parameter's local shard), with
each shard's optimizer state replicated across them as in DDP. So the DDP hook's state
(:class:`hvdcompress.torch.ddp.CompressionState`) runs it over the replicate process group, on
the local shards (:func:`hvdcompress.torch.tensors.local`): the same driver and engine (the flat
exchange, any compressor it takes), error feedback per shard, SGD's momentum correction and
FrozenAdam on the shard's state, the variance schedule, ``check_replicas`` across replicas, and
the same checkpoint store. Checkpoints: ``state_dict(gather=True)`` holds every rank's state (a
collective over the mesh; the same dict on every rank, R times the model's compression state on
the host) and resumes at any mesh (R', S'): each rank cuts its new dim-0 shard from every old
shard's state (:mod:`hvdcompress.state.mesh`: residuals, momenta, FrozenAdam's m and v bit for
bit; counters and ``adam.unit`` carried; an entry that cannot be cut, PowerSGD's warm Q, refused
at another number of shards), then the replicas are redistributed as the DDP hook's load does
(the unsent error-feedback mass entering the average and the mean momentum kept, m and v
replica 0's). ``state_dict()`` (this rank's) resumes at the same mesh on the same shard only.
Every load is all or nothing: a refused checkpoint raises a ``ValueError`` naming the entry and
changes nothing. Each parameter's shard
is compressed and launched as FSDP assigns its gradient (a post-accumulate-grad hook); the end
of the backward pass decodes the averages into the gradients.

FSDP's reduce-scatter (inside the node) stays dense, or with ``intra_node=`` (a compressor the
sharded reduce-scatter takes, e.g. ``Int8()``, ``{"compressor": "bf16"}``) runs as FULL_SHARD's
compressed reduce-scatter over the shard group (:mod:`hvdcompress.torch.hsdp_in_node`): the state
owns it (:attr:`HSDPState.in_node`; bytes in :attr:`HSDPState.in_node_bytes` and ``total_bytes``;
its state in the checkpoints, entry ``'in_node'``, resumed at the same mesh only).

Memory: residuals and FrozenAdam's state are of the shard's size, 1/S of the model per rank.

FSDP2 has no public switch that drops its replicate all-reduce and still assigns gradients:
``set_requires_all_reduce(False)`` is its accumulation path (the reduce-scattered shard stays in
FSDP, no ``.grad``) and ``set_all_reduce_hook`` runs after the all-reduce. So :func:`compress`
gives each FSDP parameter group the shard dimension's mesh info (FSDP then runs as FULL_SHARD
over the shard dimension and its reduce-scatter averages over S) while the parameters stay
DTensors on the 2-D mesh: private FSDP2 state, checked here (:func:`take_replicate_all_reduce`).
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Mapping, Optional, Union

import torch
import torch.distributed as dist

from ..contract.compressor import Compressor
from ..engines.accounting import ByteCount
from ..state import mesh as mesh_state
from ..transport.objects import allgather_object
from . import hsdp_in_node
from .ddp import CompressionState
from .dist_collectives import DistCollectives
from .tensors import CONVERSIONS, OPS, local, weak_hook

#: module -> its HSDPState: the model keeps its state alive (the user need not hold it), and the
#: state, which holds the parameters, does not keep the model (nor itself, through the parameters'
#: hooks, which autograd holds where Python's collector cannot see) alive once the model is gone
_STATES: "weakref.WeakKeyDictionary[torch.nn.Module, HSDPState]" = weakref.WeakKeyDictionary()

__all__ = ["HSDPState", "compress", "is_hsdp", "take_replicate_all_reduce"]


class _Shard:
    """Parameters and their local gradients as a DDP bucket for :meth:`CompressionState.reduce`
    (``last``: the step's end, with no parameter)."""

    def __init__(self, params: list, grads: list, last: bool = False):
        self._params, self._grads, self._last = params, grads, last
        self._buffer = grads[0] if grads else torch.empty(0)

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def parameters(self) -> list:
        return self._params

    def gradients(self) -> list:
        return self._grads

    def is_last(self) -> bool:
        return self._last


class HSDPState(CompressionState):
    """The DDP hook's state over ``replicate_group``, fed each parameter's local gradient shard
    of ``module`` (an FSDP2 HSDP model whose replicate all-reduce :func:`take_replicate_all_reduce`
    took over) at its post-accumulate-grad hook. ``shards``: the shard dimension's size (for
    :attr:`cross_node_bytes`); ``shard_group``: its process group. ``clip_grad_norm``: as the DDP
    hook's, on the replica's whole gradient: the norm's square summed over the shard group (one
    scalar all-reduce inside the node). Other arguments as :class:`~hvdcompress.torch.ddp.CompressionState`'s.

    ``in_node``: the in-node reduce-scatter's :class:`hvdcompress.torch.fsdp.CompressionState`
    over ``shard_group`` (``intra_node=``; None: FSDP's own, dense). ``total_bytes`` /
    ``last_step_bytes``: this rank's dense versus sent bytes of the compressed collectives (the
    replicate all-reduce, plus the in-node reduce-scatter's :attr:`in_node_bytes`);
    :attr:`cross_node_bytes`: what crosses the replicate dimension, ``dense`` being what FSDP's
    own all-reduce sends there.
    """

    def __init__(self, module: torch.nn.Module, replicate_group: Any, shards: int, shard_group: Any,
                 compression: Union[Compressor, Mapping, None] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, collective: str = "auto",
                 check_replicas: Optional[int] = None, scaler: Optional[torch.amp.GradScaler] = None,
                 clip_grad_norm: Optional[float] = None, in_node: Optional[Any] = None):
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        super().__init__(replicate_group, compression, optimizer, collective, named_parameters=named,
                         check_replicas=check_replicas, scaler=scaler, clip_grad_norm=clip_grad_norm)
        self._shards, self._shard_group = shards, shard_group
        self._fsdp_dense = 0   # bytes FSDP's all-reduce would have sent, since construction
        self.in_node = in_node
        self._in_node_fresh = None if in_node is None else in_node.state_dict()   # a load without one
        _STATES[module] = self   # alive with the model: its replicas never silently drift apart
        for _, p in named:
            p.register_post_accumulate_grad_hook(weak_hook(self, "_accumulated"))

    @property
    def cross_node_bytes(self) -> ByteCount:
        """This rank's bytes across the replicate dimension since construction: ``dense`` =
        FSDP's all-reduce of each padded shard (dim 0 padded to a multiple of the shards, in the
        gradient's dtype), ``sent`` = the compressed payloads."""
        total = self.driver.total_bytes
        return ByteCount(self._fsdp_dense, total.sent, total.steps)

    in_node_bytes = property(lambda self: hsdp_in_node.bytes_of(self.in_node),
                             doc="this rank's dense (float32 flat unit gradients) versus sent bytes of the "
                                 "in-node reduce-scatter since construction (zero without intra_node=)")
    total_bytes = property(lambda self: self.driver.total_bytes.plus(self.in_node_bytes),
                           doc="this rank's dense versus sent bytes since construction, both collectives")
    last_step_bytes = property(lambda self: self.driver.last_step_bytes.plus(
        hsdp_in_node.bytes_of(self.in_node, last=True)),
                               doc="this rank's dense versus sent bytes of the last step, both collectives")

    def _accumulated(self, p: torch.Tensor) -> None:
        """FSDP assigned ``p.grad`` (this rank's shard of the shard dimension's mean): launch its
        exchange; the step's first one queues the step's end at the end of the backward pass."""
        if not self._buckets:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
        grad = local(p.grad)
        rows = math.ceil(p.shape[0] / self._shards) if p.dim() else 1
        self._fsdp_dense += rows * math.prod(p.shape[1:]) * grad.element_size()
        self.reduce(_Shard([p], [grad]))

    def _norm_of(self, local_norm: torch.Tensor) -> torch.Tensor:
        """The replica's gradient norm from this rank's shards' norm (the shard group's sum of
        squares): what the DDP hook's clips read (its ``clip_local`` / ``clip_mean``)."""
        square = local_norm.square()
        dist.all_reduce(square, group=self._shard_group)
        return square.sqrt()

    def _end_backward(self) -> None:
        if self._buckets:   # empty when a launch failed (the step was dropped)
            self.reduce(_Shard([], [], last=True))

    # ---- checkpoints -------------------------------------------------------------------------------
    def state_dict(self, gather: bool = False) -> dict:
        """The DDP hook's checkpoint and the mesh (``'mesh'``: replicas, shards). This rank's
        (``'tensors'``, and ``'mesh'`` its replica and shard) or, with ``gather=True``, every rank's
        (a collective over the whole mesh; the same on every rank): ``'shards'``, a list over the
        shards of the list over the replicas of their states, as :func:`hvdcompress.state.mesh.for_shard`
        reads it. With ``intra_node=``, ``'in_node'``: :func:`hvdcompress.torch.hsdp_in_node.save`."""
        own = super().state_dict(gather)
        own["mesh"] = {"replicas": self.driver.comm.world, "shards": self._shards}
        like = torch.zeros(1, device=self._device())
        if self.in_node is not None:
            own["in_node"] = hsdp_in_node.save(self.in_node, gather, self.process_group, like)
        if gather:
            own["shards"] = allgather_object(own.pop("ranks"), DistCollectives(self._shard_group), OPS, like)
        else:
            own["mesh"].update(replica=self.driver.comm.rank, shard=dist.get_rank(self._shard_group))
        return own

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Restore :meth:`state_dict`'s output, all or nothing: a gathered one at any mesh (this
        rank's shard cut from every shard's state, :func:`hvdcompress.state.mesh.for_shard`, then the
        replicas as the DDP hook's load redistributes them); one rank's on the same shard of the
        same number of shards and replicas; the in-node state at the same mesh only (a checkpoint
        without one starts it afresh).
        A refused one raises a ``ValueError`` naming the entry and changes nothing. Local."""
        mine = hsdp_in_node.chosen(self.in_node, state_dict, (self.driver.comm.world, self._shards),
                                   self.driver.comm.rank, self._in_node_fresh)
        rest = dict(state_dict) if isinstance(state_dict, Mapping) else state_dict
        if isinstance(rest, dict):
            rest.pop("in_node", None)
        own = mesh_state.for_shard(rest, CONVERSIONS, self.driver.tensors, self._shards,
                                   dist.get_rank(self._shard_group))
        hsdp_in_node.load(self.in_node, mine, lambda: super(HSDPState, self).load_state_dict(own))


def refuse_hybrid_shard(module: torch.nn.Module) -> None:
    """FSDP1's hybrid strategies refuse communication hooks: name the FSDP2 route."""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    hybrid = (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)
    for m in module.modules():
        if isinstance(m, FullyShardedDataParallel) and m.sharding_strategy in hybrid:
            raise ValueError(f"compress: FSDP1 with sharding_strategy={m.sharding_strategy.name}: FSDP1's "
                             "hybrid strategies take no communication hook. Use FSDP2's HSDP: mesh = "
                             "init_device_mesh(device, (replicas, shards), mesh_dim_names=('replicate', 'shard')); "
                             "fully_shard(layer, mesh=mesh) for each layer, then fully_shard(model, mesh=mesh); "
                             "then fsdp.compress(model, compression=..., optimizer=opt)")


def is_hsdp(module: torch.nn.Module) -> bool:
    """Whether ``module``'s parameters are FSDP2 HSDP DTensors: on a 2-D mesh, replicated over
    the first dimension and sharded over the second."""
    from torch.distributed.tensor import Replicate, Shard
    return any(getattr(p, "device_mesh", None) is not None and p.device_mesh.ndim == 2
               and isinstance(p.placements[0], Replicate) and isinstance(p.placements[1], Shard)
               for p in module.parameters())


def take_replicate_all_reduce(module: torch.nn.Module) -> tuple:
    """Stop FSDP2's all-reduce over the replicate dimension on every ``FSDPModule`` under
    ``module`` (its groups' mesh info becomes the shard dimension's: module doc); returns (the
    replicate process group, the number of shards, the shard process group). A ``ValueError`` when the groups are not all
    HSDP over one replicate group, sharded on dim 0."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, HSDPMeshInfo
    from torch.distributed.tensor import Shard
    groups = [g for m in module.modules() if isinstance(m, FSDPModule)
              for g in getattr(m._get_fsdp_state(), "_fsdp_param_groups", None) or ()]
    infos = [g.mesh_info for g in groups]
    if not infos or not all(isinstance(i, HSDPMeshInfo) for i in infos):
        raise ValueError(f"compress: HSDP needs every FSDP module under {type(module).__name__} "
                         "sharded on one (replicate, shard) mesh; found "
                         f"{sorted({type(i).__name__ for i in infos}) or 'no FSDP parameter groups'}")
    replicas = {tuple(dist.get_process_group_ranks(i.replicate_process_group)) for i in infos}
    if len(replicas) != 1:
        raise ValueError(f"compress: FSDP modules replicate over different groups {sorted(replicas)}; "
                         "HSDP compression needs one mesh for every module")
    for p in module.parameters():
        if getattr(p, "placements", None) is not None and p.placements[1] != Shard(0):
            raise ValueError(f"compress: a parameter sharded as {p.placements[1]}: HSDP compression "
                             "takes FSDP2's default Shard(0) (no shard_placement_fn)")
    for g in groups:
        old = g.mesh_info
        new = FSDPMeshInfo(old.mesh, shard_mesh_dim=old.shard_mesh_dim, dp_mesh_dims=old.dp_mesh_dims,
                           spmd_mesh=old.spmd_mesh)
        if g.post_forward_mesh_info is old:   # reshard_after_forward=True: the same mesh after forward
            g.post_forward_mesh_info = new
        g.mesh_info = new
    return infos[0].replicate_process_group, infos[0].shard_mesh_size, infos[0].shard_process_group


def compress(module: torch.nn.Module, compression: Union[Compressor, Mapping, None] = None,
             optimizer: Optional[torch.optim.Optimizer] = None, collective: str = "auto",
             check_replicas: Optional[int] = None, scaler: Optional[torch.amp.GradScaler] = None,
             clip_grad_norm: Optional[float] = None, in_node: Optional[Any] = None) -> HSDPState:
    """Compress the replicate all-reduce of an FSDP2 HSDP ``module`` (``fully_shard`` applied to
    its layers and itself on a ``("replicate", "shard")`` mesh, before its first forward);
    returns the :class:`HSDPState`. ``optimizer``: the one stepping ``module`` (SGD: the
    momentum take-over; Adam/AdamW: needed by FrozenAdam; needed by ``scaler``, a
    ``torch.amp.GradScaler`` handled as by the DDP hook). ``in_node``: ``factory(shard_group)``
    building the in-node reduce-scatter's state (``fsdp.compress``'s ``intra_node=``), or None."""
    intra = None if in_node is None else hsdp_in_node.build(in_node, module, scaler)   # before FSDP changes
    group, shards, shard_group = take_replicate_all_reduce(module)
    state = HSDPState(module, group, shards, shard_group, compression, optimizer, collective, check_replicas,
                      scaler, clip_grad_norm, intra)
    if intra is not None:
        hsdp_in_node.install(module, intra)
    return state
