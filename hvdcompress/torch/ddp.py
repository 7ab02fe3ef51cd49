"""Every hvdcompress compressor as a PyTorch DistributedDataParallel communication hook.

Modelled on DDP's PowerSGD hook::

    from hvdcompress import DGC
    from hvdcompress.torch import ddp
    state = ddp.CompressionState(compression=DGC(0.999), optimizer=opt,
                                 named_parameters=model.named_parameters())
    model.register_comm_hook(state, ddp.compression_hook)

The DDP front end of the step driver (:mod:`hvdcompress.step.driver`): each tensor is compressed,
sent and decoded exactly as :class:`hvdcompress.torch.DistributedOptimizer` does it, over
torch.distributed (:class:`~hvdcompress.torch.dist_collectives.DistCollectives`): for the same
gradients, compressor and seed the averaged gradients are the same bits wherever the sum is.

The state may be built before ``init_process_group`` (Lightning's
``DDPStrategy(ddp_comm_state=..., ddp_comm_hook=...)``, as PyTorch's PowerSGDState): the engine,
the collectives and the rank agreement start at the first hook call.

Buckets are the fusion: each bucket's parameters are compressed (each as its own tensor) and
launched as soon as DDP hands it over; the last bucket's hook waits for every round and decodes
the averages into the buffers. State lives per parameter name (``named_parameters``; without
it, numbered in the order DDP first hands parameters over), never per bucket, so it survives
DDP's bucket rebuild. Take-overs as on the Horovod front end: SGD's momentum (its ``step`` runs
with the taken settings at 0), or FrozenAdam's update in place of an Adam/AdamW's ``step``.

Mixed precision: ``scaler=`` (with ``optimizer=``) unscales each gradient in the hook before
compression; the user's loop stays ``scaler.scale(loss).backward(); scaler.step(opt);
scaler.update()``; an overflow on any rank puts the compressor state back and the scaler skips
the step on every rank (:mod:`hvdcompress.step.loss_scale`).
"""
from typing import Any, Callable, Iterable, Mapping, Optional, Union

import torch
import torch.distributed as dist

from ..adam.settings import AdamSettings, adam_settings
from ..contract.compressor import Compressor, TensorInfo
from ..engines.contract import Engine
from ..engines.fusion import FusedKey, totals
from ..engines.selection import select_engine
from ..state import store as state_store
from ..step.arguments import documented
from ..step.driver import Completion, StepDriver
from ..step.frontend import FrontEnd
from ..step.names import check_names
from ..step.options import parse_options
from ..transport.collectives import check_collective
from .clipping import clip_gradients, clip_local_gradients
from .dist_collectives import DistCollectives, node_collectives, node_groups, whole_group
from .fusion import bucket_tensors
from .grad_scaler import enabled_scaler, scaler_link
from .momentum_takeover import hook_optimizer, takes_over
from .tensors import CONVERSIONS, OPS, adam_update, local, state_layout, tensor_info

__all__ = ["CompressionState", "compression_hook", "node_groups"]


@documented("compression", "clip_grad_norm", "collective", "intra_node", "check_replicas", "scaler",
            "fusion", "bytes")
class CompressionState(FrontEnd):
    """The state of :func:`compression_hook`: the compressor, its per-parameter state, the
    driver and the step's buckets. Build it on every rank, before or after ``init_process_group``.

    ``process_group``: the group DDP reduces over (None: the default group). ``optimizer``: the
    optimizer stepping the DDP model's parameters (SGD: the momentum take-over; Adam/AdamW:
    needed by ``FrozenAdam``; needed by ``scaler=``). ``named_parameters``:
    ``model.named_parameters()``, the names the state is kept under (needed by ``fusion=`` and by
    a gathered checkpoint). Two-level compression (default group only) runs over the node and
    cross-node groups of :func:`node_groups`, made at the first hook call. The replica check runs
    before the exchange, on the parameters as the last step left them; a difference raises
    :class:`hvdcompress.ReplicaMismatch` from ``backward()`` on every rank.
    """

    def __init__(self, process_group: Optional[Any] = None,
                 compression: Union[Compressor, Mapping, None] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, collective: str = "auto",
                 intra_node: Union[Compressor, Mapping, None] = None,
                 ranks_per_node: Optional[int] = None,
                 named_parameters: Optional[Iterable] = None,
                 clip_grad_norm: Optional[float] = None, check_replicas: Optional[int] = None,
                 fusion: Union[bool, int, None] = None, scaler: Optional[torch.amp.GradScaler] = None):
        scaler = enabled_scaler(scaler)
        self.options = parse_options(compression, op="average", average_op="average", sum_op="sum",
                                     clip_grad_norm=clip_grad_norm, collective=collective,
                                     intra_node=intra_node, ranks_per_node=ranks_per_node,
                                     check_replicas=check_replicas, fusion=fusion, scaler=scaler,
                                     scaler_types=(torch.amp.GradScaler,), **whole_group(process_group))
        self.compressor = compressor = self.options.compressor
        check_collective(collective, compressor)   # before any collective runs
        if compressor.takes_over_adam and optimizer is None:
            raise ValueError(f"compression={compressor!r} with optimizer=None: FrozenAdam "
                             "replaces the optimizer's step; pass optimizer=the torch.optim.Adam "
                             "or AdamW that steps the DDP model")
        self.process_group = process_group
        self.optimizer = optimizer
        self._takes_over = optimizer is not None and takes_over(compressor, optimizer)
        self._group_of: dict = {}      # parameter -> its param group (the take-overs read it)
        self._names: dict = {} if named_parameters is None else check_names(named_parameters)
        self._named = named_parameters is not None
        self._fused = self._fusion_buckets()   # parameter name -> its fused bucket (fusion=)
        self._buckets: list = []       # this step's (future, buffer, [key]) of each DDP bucket
        self._pairs: list = []         # key (an index) -> this step's (param, flat grad)
        super().__init__(StepDriver(self.options, OPS, self._build_exchange,
                                    lambda: DistCollectives(process_group),
                                    "hvdcompress.torch.ddp.CompressionState",
                                    adam=hook_optimizer(compressor, optimizer, self._adam_step)))
        self.driver.completion = Completion({b.name: len(b.members) for b in self._fused.values()})
        self.buckets = {b.name: b for b in self._fused.values()}
        if self._named:   # else numbered at the first step (the agreement describes them then)
            self.driver.describe((n, p.shape, p.dtype) for p, n in self._names.items())
        self.scaler = scaler_link(scaler, optimizer)
        self.driver.guard = None if self.scaler is None else self.scaler.guard

    exchange = property(lambda self: self.driver.engine, doc="the exchange engine (built at first use)")
    comm = property(lambda self: self.driver.comm)
    last_step_bytes = property(lambda self: self.driver.last_step_bytes,
                               doc="this rank's dense versus sent bytes of the last step")
    total_bytes = property(lambda self: self.driver.total_bytes,
                           doc="this rank's dense versus sent bytes since construction")

    def _build_exchange(self) -> Engine:
        options = self.options
        return select_engine(options.compressor, OPS, self.comm, intra_node=options.intra_node,
                             node_comms=lambda: node_collectives(options.ranks_per_node),
                             collective=options.collective)

    def _fusion_buckets(self) -> dict:
        """Parameter name -> its fused bucket with ``fusion=``, cut by name over every trainable
        named parameter (not by DDP's buckets, which DDP rebuilds after the first step)."""
        if self.options.fusion is None:
            return {}
        if not self._named:
            raise ValueError(f"fusion={self.options.fusion!r} without named_parameters: the fused "
                             "buckets are cut in name order; pass named_parameters=model.named_parameters()")
        groups = () if self.optimizer is None else self.optimizer.param_groups
        buckets = self.options.buckets(bucket_tensors(((n, p) for p, n in self._names.items()), groups))
        return {m: b for b in buckets for m in b.members}

    def _device(self) -> torch.device:
        """Where the agreement's bytes travel from: the current CUDA device under NCCL."""
        backend = dist.get_backend(self.process_group)
        return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")

    def _adam_step(self, closure: Optional[Callable] = None) -> Optional[torch.Tensor]:
        """The optimizer's step under FrozenAdam (:func:`hvdcompress.torch.tensors.adam_update`),
        then the compressor's step count."""
        loss = adam_update(self.driver.adam, self.optimizer.param_groups,
                           lambda p: self.driver.states.tensor(self._name(p)), self._name, closure)
        self.driver.end_update()
        return loss

    # ---- the hook ----------------------------------------------------------------------------------
    def _name(self, p: torch.Tensor) -> str:
        if p not in self._names:
            if self._named:
                raise ValueError(f"a parameter of shape {tuple(p.shape)} in a DDP bucket is not in "
                                 "named_parameters: pass the DDP model's own named_parameters()")
            self._names[p] = f"param{len(self._names)}"
        return self._names[p]

    def _group(self, p: torch.Tensor) -> dict:
        """``p``'s param group in the optimizer (the take-overs read its settings every step)."""
        if p not in self._group_of:   # param groups added since
            self._group_of = {q: g for g in self.optimizer.param_groups for q in g["params"]}
        if p not in self._group_of:
            raise ValueError(f"parameter '{self._name(p)}' is not in the optimizer given as "
                             "optimizer=: the take-over of its step needs its param group")
        return self._group_of[p]

    # ---- the front-end contract (hvdcompress.step.frontend): keys index this step's pairs ----------
    def name(self, key: int) -> str:
        return self._name(self._pairs[key][0])

    def gradient(self, key: int) -> torch.Tensor:
        return self._pairs[key][1]

    def info(self, key: int) -> TensorInfo:
        return self._param_info(self._pairs[key][0])

    def _param_info(self, p: torch.Tensor) -> TensorInfo:
        return tensor_info(p, self._name(p), self.comm.world, self.comm.rank,
                           self._group(p) if self._takes_over else None)

    def settings(self, key: int) -> Optional[AdamSettings]:
        return adam_settings(self._group(self._pairs[key][0])) if self.driver.adam is not None else None

    def group(self, key: int) -> Optional[str]:
        bucket = self._fused.get(self.name(key))
        return None if bucket is None else bucket.name

    def unscale(self, key: int) -> None:
        self.scaler.unscale_tensor(self._pairs[key][1])

    def out_of(self, entry: Any) -> Optional[torch.Tensor]:
        return None if isinstance(entry.key, FusedKey) else self._pairs[entry.key][1]

    def write(self, entry: Any) -> None:
        for key, total in totals(OPS, entry):
            grad = self._pairs[key][1]
            if total is not None and total is not grad:
                grad.copy_(total)

    #: the norm of the whole model's gradient from this rank's part's (None: this rank holds all of it)
    _norm_of: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    def clip_local(self, keys: list, scale: float) -> None:
        clip_local_gradients([self._pairs[k][1] for k in keys], self.options.clip_grad_norm,
                             self.comm.world, scale=scale, norm_of=self._norm_of)

    def clip_mean(self, keys: list) -> Any:
        return clip_gradients([self._pairs[k][1] for k in keys], self.options.clip_grad_norm,
                              norm_of=self._norm_of)

    def incomplete(self, leftovers: list) -> None:
        if leftovers:
            raise RuntimeError(f"fused buckets {[gid for gid, _ in leftovers]} missed members at the "
                               "last DDP bucket: every trainable named parameter must get a gradient each step")

    # ---- the hook -------------------------------------------------------------------------------
    def reduce(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """:func:`compression_hook`'s work for one bucket."""
        buffer = bucket.buffer()
        if buffer.is_sparse:
            raise ValueError("a DDP bucket holds sparse gradients, which the compression hook "
                             "cannot compress; use dense gradients (e.g. nn.Embedding(sparse=False))")
        future: torch.futures.Future = torch.futures.Future()
        try:
            if not self._buckets:   # the step's first bucket
                self._begin_step()
            keys = list(range(len(self._pairs), len(self._pairs) + len(bucket.parameters())))
            self._pairs.extend(zip(bucket.parameters(), [g.reshape(-1) for g in bucket.gradients()]))
            self._buckets.append((future, buffer))
            self.ready(keys)
            if bucket.is_last():
                skipped = self.wait()
                if self.driver.adam is None:   # FrozenAdam counts its steps in the optimizer's step
                    self.updated(skipped)
                for waiting, result in self._buckets:
                    waiting.set_result(result)
        except BaseException as error:  # the step is lost: fail every future DDP would wait on
            for waiting, _ in self._buckets or [(future, None)]:
                if not waiting.done():
                    waiting.set_exception(error)
            self._buckets, self._pairs = [], []
            self.forget()
            raise
        if bucket.is_last():
            self._buckets, self._pairs = [], []
        return future

    def _begin_step(self) -> None:
        """At the first bucket: the rank agreement (once) and the replica check on the parameters
        as the last step left them."""
        by_name = sorted(self._names.items(), key=lambda item: item[1])
        self.driver.agree([(n, tuple(p.shape), str(p.dtype)) for p, n in by_name], torch.zeros(1, device=self._device()))
        self.driver.check_replicas(lambda: [(n, local(p).detach()) for p, n in by_name])

    # ---- checkpoints -------------------------------------------------------------------------------
    def state_dict(self, gather: bool = False) -> dict:
        """The compressor's own state (schedules), the world size and op, and every tensor's
        buffers keyed by parameter name: this rank's (``'tensors'``) or, with ``gather=True``,
        every rank's (``'ranks'``, a collective): :mod:`hvdcompress.state.store`."""
        return state_store.save(self.driver, CONVERSIONS, gather, torch.zeros(1, device=self._device()))

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Restore :meth:`state_dict`'s output: a gathered one at any world size (the unsent
        mass and mean momentum kept; needs ``named_parameters``), one rank's at the same world
        size. All or nothing: the whole state is checked and built first
        (:func:`hvdcompress.state.store.prepare`); a refused one (a ``ValueError`` naming the entry)
        changes nothing. Without ``named_parameters`` any tensor name is taken (numbered at the
        first step). Local: no collective."""
        if "ranks" in state_dict and not self._named:
            raise ValueError("load_state_dict of a gathered state (state_dict(gather=True)) lays each "
                             "tensor out by its parameter: pass named_parameters=model.named_parameters()")
        known = [*self._names.values(), *{b.name for b in self._fused.values()}] if self._named else None
        commit = state_store.prepare(self.driver, state_dict, CONVERSIONS, known, self._layout)
        self.forget()
        commit()

    def _layout(self, name: str) -> tuple:
        """(numel, a tensor on its device or None, whether it runs as a compressed allreduce)."""
        by_name = {n: p for p, n in self._names.items()}
        bucket = next((b for b in self._fused.values() if b.name == name), None)
        params = [by_name[m] for m in bucket.members] if bucket is not None else [by_name.get(name)]
        if params[0] is None:
            return 0, None, lambda: False
        return state_layout(self.driver, params, bucket, self._param_info)

# No ``from __future__ import annotations`` in this module: DDP's register_comm_hook compares
# the hook's annotations with dist.GradBucket and Future[Tensor] themselves, not their strings.
def compression_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's gradients averaged over the process group through
    ``state``'s compressor; the future's value is the bucket's buffer, holding the average.
    Register with ``model.register_comm_hook(state, compression_hook)``."""
    return state.reduce(bucket)
