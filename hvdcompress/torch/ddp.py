"""Every hvdcompress compressor as a PyTorch DistributedDataParallel communication hook.

Modelled on DDP's PowerSGD hook::

    from hvdcompress import DGC
    from hvdcompress.torch import ddp
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = ddp.CompressionState(compression=DGC(0.999), optimizer=opt,
                                 named_parameters=model.named_parameters())
    model.register_comm_hook(state, ddp.compression_hook)

It runs the exchange engine of the Horovod front end (:mod:`hvdcompress.exchange`) over
torch.distributed (:class:`~hvdcompress.torch.dist_collectives.DistCollectives`), so each
tensor is compressed, sent and decoded exactly as :class:`hvdcompress.torch.DistributedOptimizer`
does it: for the same gradients, compressor and seed the averaged gradients are the same bits
wherever the sum is (allgather payloads are summed by the engine in rank order; an allreduce
of 2 ranks adds two numbers, which commutes).

Buckets are the fusion. DDP hands the hook a bucket (a flat buffer holding the local gradients
of a few parameters) as soon as its gradients are ready; the hook compresses each parameter's
slice as its own tensor (top-k per tensor, PowerSGD per matrix, DGC's dense small tensors) and
launches the bucket's payloads together, one collective per kind and dtype, while the backward
pass goes on. The hook of the last bucket waits for every bucket's rounds (PowerSGD's and CSC's
second round is launched then, in the same order on every rank), decodes the average into each
bucket's buffer and completes the futures DDP waits on at the end of the backward pass. The
trade-off, the same as the Horovod front end's ``synchronize()``: decoding does not overlap the
backward pass, and the rounds after the first start only when it is done.

State lives per parameter name, never per bucket: residuals, momenta and PowerSGD's factors
survive DDP's bucket rebuild (after the first iteration DDP regroups the parameters in the
order their gradients became ready) and go into :meth:`CompressionState.state_dict`. Names come
from ``named_parameters``; without it, parameters are numbered in the order DDP first hands
them over (its initial buckets, the same on every rank and every run of the same model and
``bucket_cap_mb``).

Momentum take-over: with ``optimizer`` a ``torch.optim.SGD``, DGC, CSC and ``Momentum`` apply
its momentum, Nesterov and weight decay themselves (:mod:`hvdcompress.torch.momentum_takeover`),
read from its param groups at every step; its ``step()`` then runs with them at 0 (step pre- and
post-hooks on the optimizer), so schedulers and checkpoints keep the user's values.

Adam take-over: with ``FrozenAdam`` (:mod:`hvdcompress.adam`) and ``optimizer`` a
``torch.optim.Adam``/``AdamW``, the hook sends what FrozenAdam sends (the gradient dense in its
warm-up, then compressed; or each rank's momentum) and the optimizer's ``step`` is replaced, on
that instance, by FrozenAdam's update from the exchanged mean (m and v live in the hook's state,
so in :meth:`CompressionState.state_dict`, not in the optimizer's). Build the state before any
LR scheduler, which wraps the optimizer's ``step`` it finds.
"""
import os
import warnings
from collections import Counter
from contextlib import ExitStack
from typing import Any, Callable, Iterable, Mapping, Optional, Union

import torch
import torch.distributed as dist

from ..adam import adam_settings
from ..agreement import check_ranks_agree
from ..compressor import Compressor, TensorInfo
from ..collectives import check_collective
from ..exchange import Exchange
from ..fusion import FusedKey, compress_bucket, totals
from ..options import parse_options
from ..process_sets import node_layout
from ..replicas import ReplicaCheck, counters_checksum
from ..two_level import TwoLevelExchange
from .backend import TorchOps
from .clipping import clip_gradients, clip_local_gradients
from .dist_collectives import DistCollectives
from .fusion import bucket_tensors
from .momentum_takeover import check_adam, check_momentum, momentum_fields, suspended, takes_over

__all__ = ["CompressionState", "compression_hook", "node_groups"]

_OPS = TorchOps()
_AVERAGE = "average"   # DDP averages: parse_options' op


def node_groups(ranks_per_node: Optional[int] = None) -> tuple:
    """(this rank's node group, its cross-node group) for two-level compression, made with
    ``dist.new_group`` on every rank (all ranks must call this, in the same order): N node
    groups of L consecutive ranks, then L cross-node groups (:func:`hvdcompress.process_sets.node_layout`).
    ``ranks_per_node`` defaults to torchrun's ``LOCAL_WORLD_SIZE``; ranks must be placed node by
    node (torchrun does)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if ranks_per_node is None:
        if "LOCAL_WORLD_SIZE" not in os.environ:
            raise ValueError("intra_node=... with ranks_per_node=None needs torchrun's "
                             "LOCAL_WORLD_SIZE; pass ranks_per_node=L (the ranks of one node)")
        ranks_per_node = int(os.environ["LOCAL_WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank % ranks_per_node))
        if local != rank % ranks_per_node:
            raise ValueError(f"rank {rank} is local rank {local}, not {rank % ranks_per_node}: "
                             "two-level compression needs ranks placed node by node with the same "
                             "number of ranks on every node")
    nodes, cross = node_layout(world, ranks_per_node)
    groups = [dist.new_group(ranks) for ranks in nodes + cross]
    return groups[rank // ranks_per_node], groups[len(nodes) + rank % ranks_per_node]


class CompressionState:
    """The state of :func:`compression_hook`: the compressor, its per-parameter state, the
    engine and the step's buckets. Build it on every rank, after ``init_process_group``.

    ``process_group``: the group DDP reduces over (None: the default group).
    ``compression``: an hvdcompress :class:`~hvdcompress.Compressor` or a dict for
    :func:`hvdcompress.from_params` (None: no compression, a plain averaged allreduce).
    ``optimizer``: the optimizer stepping the DDP model's parameters; with a ``torch.optim.SGD``,
    DGC, CSC and ``Momentum`` take its momentum and weight decay over; ``FrozenAdam`` needs it
    (an Adam or AdamW) and takes its step over (module doc).
    ``collective``: ``"auto"``, ``"allgather"`` or ``"alltoall"`` for per-rank payloads, as for
    the Horovod front end (:mod:`hvdcompress.collectives`: the compressed allreduce at P >= 3).
    ``intra_node`` / ``ranks_per_node``: two-level compression (:mod:`hvdcompress.two_level`)
    over the node and cross-node groups of :func:`node_groups` (default group only).
    ``named_parameters``: ``model.named_parameters()``, the names the state is kept under (module
    doc; recommended for checkpoints).
    ``clip_grad_norm=c``: as the Horovod front end's (:mod:`hvdcompress.clipping`): with a
    compressor that carries state, each rank clips its local gradients (all buckets) to
    c·sqrt(P) before compression, which then waits for the last bucket; otherwise the averaged
    gradients are clipped to c after the exchange (``clip_grad_norm_`` after DDP's backward).

    ``check_replicas=N``: every N-th exchange, before it, a 64-bit checksum of every parameter
    (as the last step left it) and of the compressor's counters is compared across the group
    (:mod:`hvdcompress.replicas`; default ``HVDCOMPRESS_CHECK_REPLICAS``, else off); a
    difference raises :class:`hvdcompress.ReplicaMismatch` from ``backward()`` on every rank.

    ``fusion=B``: fused compression (:mod:`hvdcompress.fusion`), as on the Horovod front end:
    consecutive named parameters in name order, of one dtype and param group, up to ``B`` bytes
    (``True``: 64 MiB) compressed as one buffer; a bucket waits for its members across DDP's
    buckets and keeps its state under its name. Needs ``named_parameters``.

    ``state.exchange.last_step_bytes`` / ``.total_bytes``: this rank's dense versus sent gradient
    bytes (:class:`~hvdcompress.accounting.ByteCount`). A warm-up schedule is driven by
    ``hvdcompress.SparsityScheduler(state.compressor)``.
    """

    def __init__(self, process_group: Optional[Any] = None,
                 compression: Union[Compressor, Mapping, None] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, collective: str = "auto",
                 intra_node: Union[Compressor, Mapping, None] = None,
                 ranks_per_node: Optional[int] = None,
                 named_parameters: Optional[Iterable] = None,
                 clip_grad_norm: Optional[float] = None, check_replicas: Optional[int] = None,
                 fusion: Union[bool, int, None] = None):
        if intra_node is not None and process_group not in (None, dist.group.WORLD):
            raise ValueError(f"intra_node={intra_node!r} with process_group={process_group!r}: "
                             "two-level compression runs over all ranks (its own node and "
                             "cross-node groups); use process_group=None or intra_node=None")
        self.options = parse_options(compression, op=_AVERAGE, average_op=_AVERAGE, sum_op="sum",
                                     clip_grad_norm=clip_grad_norm, collective=collective,
                                     intra_node=intra_node, ranks_per_node=ranks_per_node,
                                     check_replicas=check_replicas, fusion=fusion)
        self.compressor = compressor = self.options.compressor
        check_collective(collective, compressor)   # before any collective runs
        if getattr(compressor, "takes_over_adam", False) and optimizer is None:
            raise ValueError(f"compression={compressor!r} with optimizer=None: FrozenAdam "
                             "replaces the optimizer's step; pass optimizer=the torch.optim.Adam "
                             "or AdamW that steps the DDP model")
        self.process_group = process_group
        self.comm = DistCollectives(process_group)
        self.exchange = self._build_exchange()
        self.optimizer = optimizer
        self._takes_over = optimizer is not None and takes_over(compressor, optimizer)
        self._group_of: dict = {}      # parameter -> its param group (the take-over's settings)
        self._adam = self._check_optimizer()
        self._clip_before = False      # this step's choice (FrozenAdam's warm-up clips after)
        self._names: dict = {} if named_parameters is None else self._check_names(named_parameters)
        self._named = named_parameters is not None
        self._fused = self._fusion_buckets()   # parameter name -> its fused bucket (fusion=)
        self._waiting: dict = {}       # bucket name -> its members' (grad, x, info) so far
        self._tensors: dict = {}       # parameter name -> the compressor's state of that tensor
        self._to_device: set = set()   # names loaded by load_state_dict, moved at first use
        self._suspension = ExitStack()
        self._buckets: list = []       # this step's (future, buffer, [(param, flat grad)])
        self._flights: list = []       # launched rounds, in launch order
        self._replicas = ReplicaCheck(self.options.check_replicas, _OPS, self.comm)
        check_ranks_agree({"params": [(n, tuple(p.shape), str(p.dtype)) for p, n in
                                      sorted(self._names.items(), key=lambda item: item[1])],
                           **self.options.agreement(self.exchange)},
                          self.comm, _OPS, torch.zeros(1, device=self._device()),
                          "hvdcompress.torch.ddp.CompressionState")

    # ---- construction ----------------------------------------------------------------------------
    def _build_exchange(self) -> Exchange:
        options = self.options
        if options.intra_node is None:
            return Exchange(options.compressor, _OPS, self.comm, collective=options.collective)
        node, cross = node_groups(options.ranks_per_node)
        return TwoLevelExchange(options.compressor, options.intra_node, _OPS, DistCollectives(node),
                                DistCollectives(cross), collective=options.collective)

    def _fusion_buckets(self) -> dict:
        """Parameter name -> its :class:`hvdcompress.fusion.Bucket` with ``fusion=``: cut by name
        over every trainable named parameter (not by DDP's buckets, which DDP rebuilds after
        the first step), keyed by dtype and param group."""
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

    def _check_optimizer(self) -> Optional[Compressor]:
        """Check the optimizer against the compressor and hook into its step: the momentum
        take-over's suspension around it, or FrozenAdam's step in its place (returned)."""
        compressor, optimizer = self.compressor, self.optimizer
        if optimizer is None:
            if compressor.takes_over_momentum and compressor.explicit_momentum is None:
                warnings.warn(f"{compressor.name} applies SGD's momentum itself, but no optimizer= "
                              "was given: it runs with momentum 0 (top-k with a residual). Pass "
                              "optimizer=your torch.optim.SGD so it takes that momentum over",
                              stacklevel=3)
            return None
        check_momentum(compressor, optimizer)
        adam = check_adam(compressor, optimizer)
        if self._takes_over:
            optimizer.register_step_pre_hook(self._suspend)
            optimizer.register_step_post_hook(self._restore)
        if adam is not None:
            optimizer.step = self._adam_step   # on the instance: the class's step is not run
        return adam

    @staticmethod
    def _check_names(named_parameters: Iterable) -> dict:
        """parameter -> name, from unique (name, parameter) pairs."""
        named = list(named_parameters)
        counts = Counter(item[0] for item in named if isinstance(item, tuple) and len(item) == 2)
        if sum(counts.values()) != len(named):
            raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                             "usually model.named_parameters()")
        dups = sorted(n for n, c in counts.items() if c > 1)
        if dups:
            raise ValueError(f"named_parameters: names must be unique; duplicates: {', '.join(dups)}")
        return {p: n for n, p in named}

    # ---- the optimizer's step (the take-overs) ------------------------------------------------------
    def _suspend(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        """Step pre-hook: the settings the compressor applied at 0 for the step."""
        self._restore()   # a step that raised left them at 0
        self._suspension.enter_context(suspended(optimizer, True))

    def _restore(self, *_: Any) -> None:
        """Step post-hook: the user's settings back."""
        self._suspension.close()

    def _adam_step(self, closure: Optional[Callable] = None) -> Optional[torch.Tensor]:
        """The optimizer's step under FrozenAdam: :meth:`hvdcompress.adam.FrozenAdam.after_exchange`
        for every parameter with a gradient (the exchanged mean DDP wrote), its param group's
        settings read now (schedulers keep working); then the compressor's step count."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for i, group in enumerate(self.optimizer.param_groups):
                settings = adam_settings(group, i)
                for p in (q for q in group["params"] if q.grad is not None):
                    state = self._state(self._name(p), p.device)
                    p.copy_(self._adam.after_exchange(_OPS, state, p.reshape(-1), p.grad.reshape(-1),
                                                      settings).view_as(p))
        self.compressor.on_step()
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

    def _info(self, p: torch.Tensor) -> TensorInfo:
        info = TensorInfo(name=self._name(p), numel=p.numel(), world=self.comm.world,
                          rank=self.comm.rank, shape=tuple(p.shape), param=p.detach().reshape(-1))
        if self._takes_over:
            for field, value in momentum_fields(self._group(p)).items():
                setattr(info, field, value)
        return info

    def _state(self, name: str, device: torch.device) -> dict:
        state = self._tensors.setdefault(name, {})
        if name in self._to_device:
            self._to_device.discard(name)
            state.update({k: v.to(device) if torch.is_tensor(v) else v for k, v in state.items()})
        return state

    def _launch(self, pairs: list) -> None:
        """Compress each (parameter, flat local gradient) and launch them together; with
        FrozenAdam, what it sends for the gradient (dense in its warm-up). With ``fusion=`` a
        fused bucket's members wait for each other (across DDP's buckets); the bucket is
        compressed as one when its last member comes."""
        entries = []
        for p, grad in pairs:
            info = self._info(p)
            bucket = self._fused.get(info.name)
            x = grad
            if self._adam is not None:
                settings = adam_settings(self._group(p))
                x = self._adam.before_exchange(_OPS, grad, self._state(info.name, grad.device), settings,
                                               p.detach().reshape(-1))
                info.dense = not self._adam.frozen(settings)
            if bucket is None:
                entries.append(self.exchange.compress(grad, x, self._state(info.name, grad.device), info))
                continue
            items = self._waiting.setdefault(bucket.name, [])
            items.append((grad, x, info))
            if len(items) == len(bucket.members):
                entries.append(compress_bucket(self.exchange, bucket, self._waiting.pop(bucket.name),
                                               self._state(bucket.name, grad.device)))
        if entries:
            self._flights.append(self.exchange.start(entries))

    def reduce(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """:func:`compression_hook`'s work for one bucket."""
        buffer = bucket.buffer()
        if buffer.is_sparse:
            raise ValueError("a DDP bucket holds sparse gradients, which the compression hook "
                             "cannot compress; use dense gradients (e.g. nn.Embedding(sparse=False))")
        pairs = list(zip(bucket.parameters(), [g.reshape(-1) for g in bucket.gradients()]))
        future: torch.futures.Future = torch.futures.Future()
        if not self._buckets:   # the step's first bucket
            self._check_replicas()
            self._clip_before = self.options.clip_before and (self._adam is None or not self._adam.warming_up(
                [adam_settings(g, i) for i, g in enumerate(self.optimizer.param_groups)]))
        self._buckets.append((future, buffer, pairs))
        try:
            if not self._clip_before:
                self._launch(pairs)
            if bucket.is_last():
                self._complete()
        except BaseException as error:  # the step is lost: fail every future DDP would wait on
            for waiting, _, _ in self._buckets:
                if not waiting.done():
                    waiting.set_exception(error)
            self._buckets, self._flights, self._waiting = [], [], {}
            raise
        if bucket.is_last():
            self._buckets, self._flights = [], []
        return future

    def _check_replicas(self) -> None:
        """Every ``check_replicas`` exchanges, before the exchange: the parameters as the last
        optimizer step left them and the compressor's counters, compared across the group."""
        names = sorted(self._names.items(), key=lambda item: item[1])
        self._replicas.after_step(
            lambda: [(n, p.detach()) for p, n in names],
            lambda: counters_checksum(self.compressor.state_dict(), sorted(self._tensors.items())))

    def _complete(self) -> None:
        """After the last bucket: (the local clip and the launches,) every round, the decoded
        averages in the buffers, (the clip after the exchange,) the futures completed."""
        grads = sorted(((self._name(p), g) for _, _, pairs in self._buckets for p, g in pairs),
                       key=lambda item: item[0])  # name order: the norm sums alike on every rank
        if self._clip_before:
            clip_local_gradients([g for _, g in grads], self.options.clip_grad_norm, self.comm.world,
                                 compressor=self.compressor)
            for _, _, pairs in self._buckets:
                self._launch(pairs)
        if self._waiting:
            raise RuntimeError(f"fused buckets {sorted(self._waiting)} missed members at the last DDP "
                               "bucket: every trainable named parameter must get a gradient each step")
        for flight in self._flights:
            for entry in self.exchange.finish(flight, lambda e: None if isinstance(e.key, FusedKey) else e.key):
                for grad, total in totals(_OPS, entry):
                    if total is not None and total is not grad:
                        grad.copy_(total)
        if self.options.clip_grad_norm is not None and not self._clip_before:
            clip_gradients([g for _, g in grads], self.options.clip_grad_norm)
        self.exchange.end_step()
        if self._adam is None:   # FrozenAdam counts its steps in the optimizer's (it reads t there)
            self.compressor.on_step()
        for future, buffer, _ in self._buckets:
            future.set_result(buffer)

    # ---- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The compressor's own state (schedules) and every tensor's buffers (residuals, momenta,
        PowerSGD's factors), keyed by parameter name."""
        return {"compressor": self.compressor.state_dict(), "tensors": _cloned(self._tensors)}

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Restore :meth:`state_dict`'s output (tensors move to each parameter's device when it
        is next compressed)."""
        tensors = state_dict["tensors"]
        if self._named:
            unknown = sorted(set(tensors) - set(self._names.values()) - {b.name for b in self._fused.values()})
            if unknown:
                raise ValueError(f"load_state_dict: compressor state for parameters not in "
                                 f"named_parameters: {unknown[:5]}")
        self.compressor.load_state_dict(state_dict["compressor"])
        self._tensors = _cloned(tensors)
        self._to_device = set(self._tensors)


def _cloned(tensors: Mapping) -> dict:
    """A copy of per-tensor states: name -> {key: tensor (cloned) or value}."""
    return {name: {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()}
            for name, st in tensors.items()}


# No ``from __future__ import annotations`` in this module: DDP's register_comm_hook compares
# the hook's annotations with dist.GradBucket and Future[Tensor] themselves, not their strings.
def compression_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's gradients averaged over the process group through
    ``state``'s compressor; the future's value is the bucket's buffer, holding the average.
    Register with ``model.register_comm_hook(state, compression_hook)``."""
    return state.reduce(bucket)
