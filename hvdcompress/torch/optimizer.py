"""hvdcompress.torch.DistributedOptimizer: Horovod's DistributedOptimizer with compression.

Same signature and behaviour as ``horovod.torch.DistributedOptimizer``, plus ``compression=``
taking any :class:`hvdcompress.Compressor` (or a dict for :func:`hvdcompress.from_params`).

Per parameter, once its gradient has been accumulated ``backward_passes_per_step`` times, a
hook compresses it (the compressor may update its per-tensor state: residual, momentum) and
starts the collective: payloads that can be summed go through Horovod's grouped allreduce,
per-rank payloads through its grouped allgather. ``synchronize()`` (called by ``step()``) waits,
decompresses every rank's payload, sums, averages, and writes ``p.grad``; then the wrapped
optimizer steps. A dense contiguous ``p.grad`` is the decoder's output buffer (``out=``): the
kernels decode into it and the average is applied in place, with no per-step allocation.

Momentum taken over: compressors with ``takes_over_momentum`` (DGC, the Momentum decorator)
apply the momentum and weight decay themselves; see :mod:`hvdcompress.torch.momentum_takeover`.
Ranks must agree on what they send: see :mod:`hvdcompress.agreement`.

Defined behaviour for unusual gradients:
  * ``p.grad is None`` on this rank at ``synchronize()``: zeros are sent (another rank may have
    a gradient), as Horovod does.
  * empty tensors: nothing is sent; the gradient stays empty.
  * integer/complex gradients: ``TypeError`` naming the parameter.
  * NaN/Inf: selected and sent like any large value, so every rank sees them as with a dense
    allreduce (AMP's GradScaler then skips the step); residuals drop non-finite entries. With
    ``scaler=`` an overflow leaves the compressor state exactly as before the step, on every
    rank (:mod:`hvdcompress.loss_scale`).
  * sparse gradients (``nn.Embedding(sparse=True)``): with ``sparse_as_dense=True`` densified
    and compressed; otherwise sent uncompressed through Horovod's sparse allreduce.
"""
from __future__ import annotations

import warnings
import weakref
from contextlib import contextmanager
from typing import Callable, Iterable, Mapping, Optional, Union

import horovod.torch as hvd
import torch

from ..accounting import ByteCount
from ..adam import adam_settings
from ..agreement import check_ranks_agree
from ..clipping import what_it_keeps
from ..compressor import Compressor, TensorInfo
from ..collectives import Planner
from ..fusion import compress_bucket, totals
from ..options import Options, parse_options
from ..replicas import ReplicaCheck, counters_checksum
from ..two_level import build_exchange
from .backend import TorchOps
from .checkpoints import CheckpointMethods
from .clipping import GradientWatch, clip_gradients, clip_local_gradients
from .collectives import HorovodCollectives
from .fusion import bucket_tensors
from .grad_scaler import GradScalerLink, inside_grad_scaler
from .momentum_takeover import check_adam, check_momentum, momentum_fields, suspended, takes_over

_OPS = TorchOps()


def _ranks_of(process_set) -> Optional[list]:
    """The global ranks of ``process_set``'s members, by index (None: the global set)."""
    return None if process_set is hvd.global_process_set else getattr(process_set, "ranks", None)


def _weak_hook(optimizer) -> Callable:
    """A gradient hook that does not keep ``optimizer`` alive: wrapping a model's parameters in a
    new optimizer leaves the old one collectable, and its hooks inert."""
    ref = weakref.ref(optimizer)

    def hook(p: torch.Tensor) -> None:
        owner = ref()
        if owner is not None:
            owner._hook(p)
    return hook


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed into the wrapped optimizer's class by :func:`DistributedOptimizer`."""

    def __init__(self, params, named_parameters, options: Options, process_set, defaults=None):
        try:
            super(self.__class__, self).__init__(params, **(defaults or {}))
        except TypeError:
            super(self.__class__, self).__init__(params)
        self._options = options
        self._compression = compression = options.compressor
        self._parameter_names = self._check_names(named_parameters)
        #: every parameter in name order: all loops that span several tensors use it (or
        #: _requires_update, its trainable part), so they run in the same order on every rank
        self._by_name = sorted(self._parameter_names, key=lambda p: self._parameter_names[p])
        self.backward_passes_per_step = options.backward_passes_per_step
        self.op = hvd.Average if options.average else hvd.Sum
        self.gradient_predivide_factor = options.predivide
        self.sparse_as_dense = options.sparse_as_dense
        self.process_set = process_set
        self.clip_grad_norm = options.clip_grad_norm
        self._awaiting_clip = []   # parameters whose gradient is complete, held for the local clip
        self._watch = GradientWatch(compression, options.intra_node)  # the clip-after-synchronize trap
        #: scaler=: unscale before compression, undo overflow steps (hvdcompress.loss_scale)
        self._scaler = GradScalerLink(options.scaler, self) if options.scaler is not None else None
        self._overflow = False     # whether the last synchronize() found an overflow (scaler=)
        self._amp_warned = False   # GradScaler.step without scaler= (a stateful compressor) warned
        self._tensor_state = {name: {} for name in self._parameter_names.values()}
        #: fusion=: bucket name -> Bucket of trainable parameters compressed as one
        self._buckets = {b.name: b for b in options.buckets(bucket_tensors(
            ((self._parameter_names[p], p) for p in self._by_name), self.param_groups))}
        self._tensor_state.update({name: {} for name in self._buckets})
        self._delay = {p: self.backward_passes_per_step for p in self._parameter_names}
        self._requires_update = []  # in name order: every multi-tensor loop is rank-independent
        self._comm = HorovodCollectives(process_set)
        self._build_exchange()
        self._prepared = {}        # group id -> [Entry] compressed, not yet launched
        self._inflight = []        # launched rounds of the exchange engine
        self._sparse = {}          # p -> handle of Horovod's sparse allreduce
        self._synchronized = False
        self._should_synchronize = True
        self._plain_step = False
        check_momentum(compression, self)
        self._adam = check_adam(compression, self)
        ids = options.group_ids(list(self._parameter_names.values()), self._name_in_groups)
        ids.update({member: b.name for b in self._buckets.values() for member in b.members})
        self._group_of = {p: ids[name] for p, name in self._parameter_names.items()}
        self._param_group = {p: g for g in self.param_groups for p in g["params"]}
        if self._included():  # a rank outside the process set does no collective (as Horovod)
            self._check_ranks_agree()
            self._register_hooks()
            # GradScaler.step then calls step() without looking at found_inf, which is only
            # known after the exchange; step() skips the update itself (outside the process
            # set GradScaler unscales and skips on the rank's own gradients, as usual)
            self._step_supports_amp_scaling = self._scaler is not None

    def _build_exchange(self) -> None:
        """The exchange engine and the replica guard for Horovod's current world."""
        options = self._options
        self._exchange = build_exchange(hvd, HorovodCollectives, self.process_set, self._compression, _OPS,
                                        intra_node=options.intra_node,
                                        ranks_per_node=options.ranks_per_node,
                                        average=options.average, predivide=options.predivide,
                                        collective=options.collective)
        self._replicas = ReplicaCheck(options.check_replicas, _OPS, self._comm, ranks=_ranks_of(self.process_set))

    def _world(self) -> int:
        return self._comm.world

    def _rank(self) -> int:
        return self._comm.rank

    def _included(self) -> bool:
        return self._comm.included()

    @property
    def last_step_bytes(self) -> ByteCount:
        """This rank's dense versus sent bytes of the last step."""
        return self._exchange.last_step_bytes

    @property
    def total_bytes(self) -> ByteCount:
        """This rank's dense versus sent bytes since construction."""
        return self._exchange.total_bytes

    # ---- construction checks -----------------------------------------------------------------
    def _check_names(self, named_parameters) -> dict:
        params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is None:
            named = [(f"allreduce.noname.{i}", p) for i, p in enumerate(params)]
        else:
            named = list(named_parameters)
        if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
            raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                             "usually produced by model.named_parameters()")
        names = [n for n, _ in named]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            raise ValueError(f"parameter names in named_parameters must be unique; duplicates: {', '.join(dups)}")
        by_id = {id(p): n for n, p in named}
        unnamed = [p for p in params if id(p) not in by_id]
        if unnamed:
            raise ValueError(f"named_parameters was given, but {len(unnamed)} optimizer parameter(s) "
                             f"are not in it (shapes: {[tuple(p.shape) for p in unnamed]})")
        return {p: by_id[id(p)] for p in params}

    def _name_in_groups(self, p) -> str:
        if not isinstance(p, torch.Tensor) or p not in self._parameter_names:
            raise ValueError("groups must be a list of lists of this optimizer's parameters")
        return self._parameter_names[p]

    def _check_ranks_agree(self) -> None:
        """Fail on every rank, with the difference, if ranks disagree on what they will send."""
        mine = {"params": [(self._parameter_names[p], tuple(p.shape), str(p.dtype)) for p in self._by_name],
                **self._options.agreement(self._exchange)}
        check_ranks_agree(mine, self._comm, _OPS, torch.zeros(1), "hvdcompress.torch.DistributedOptimizer")

    # ---- hooks and communication -----------------------------------------------------------------
    def _register_hooks(self) -> None:
        self._group_size = {}
        for p in self._by_name:
            if p.requires_grad:
                self._requires_update.append(p)
                gid = self._group_of[p]
                self._group_size[gid] = self._group_size.get(gid, 0) + 1
                p.register_post_accumulate_grad_hook(_weak_hook(self))

    def _hook(self, p: torch.Tensor) -> None:
        if self._delay[p] <= 0:
            raise AssertionError("gradients were computed more than backward_passes_per_step times "
                                 "before step() or synchronize(); increase backward_passes_per_step")
        self._delay[p] -= 1
        if self._delay[p] == 0:
            self._ready(p)

    def _ready(self, p: torch.Tensor) -> None:
        """``p``'s gradient is complete for this step: compress it now, or, with
        ``clip_grad_norm`` before the exchange, once every gradient is complete (the clip needs
        their global norm). With ``scaler=`` it is unscaled first (the clip, the compressor
        state and the exchange then see unscaled gradients)."""
        if self._scaler is not None:
            self._scaler.unscale(p)
        if not self._clips_before():
            self._prepare(p)
            return
        self._awaiting_clip.append(p)
        if len(self._awaiting_clip) == len(self._requires_update):
            # all of them, in name order (not hook order): the norm's sum is then the same on every rank
            params, self._awaiting_clip = list(self._requires_update), []
            for q in params:
                if q.grad is None:
                    q.grad = torch.zeros_like(q)
            clip_local_gradients([q.grad for q in params], self.clip_grad_norm, self._world(),
                                 average=self.op == hvd.Average, compressor=self._compression)
            for q in params:
                self._prepare(q)

    def _clips_before(self) -> bool:
        """Whether ``clip_grad_norm`` clips each rank's gradients before compression this step:
        with a compressor that carries state, except in FrozenAdam's full-precision warm-up,
        where the exchanged mean is the gradient and Horovod's clip after the exchange is exact."""
        if not self._options.clip_before or self._adam is None:
            return self._options.clip_before
        return not self._adam.warming_up([adam_settings(g, i) for i, g in enumerate(self.param_groups)])

    def _info(self, p: torch.Tensor) -> TensorInfo:
        info = TensorInfo(name=self._parameter_names[p], numel=p.numel(), world=self._world(), rank=self._rank(),
                          shape=tuple(p.shape), param=p.detach().view(-1))
        if takes_over(self._compression, self):
            for field, value in momentum_fields(self._param_group[p]).items():
                setattr(info, field, value)
        return info

    def _prepare(self, p: torch.Tensor) -> None:
        """Compress ``p.grad`` and launch its group once every member is prepared."""
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grad = p.grad
        if grad.is_sparse and not self.sparse_as_dense:
            if self._compression.takes_over_momentum:
                raise ValueError(f"parameter '{self._parameter_names[p]}' has a sparse gradient, which "
                                 f"{self._compression.name} cannot compress; use sparse_as_dense=True")
            self._sparse[p] = hvd.sparse_allreduce_async(grad, name=f"hvdc.sparse.{self._parameter_names[p]}",
                                                         op=self.op, process_set=self.process_set)
            return
        if grad.is_sparse:
            grad = grad.to_dense()
        info = self._info(p)
        if self._scaler is not None:   # undone if any rank overflows (hvdcompress.loss_scale)
            self._scaler.guard.save(info.name, self._tensor_state[info.name])
        x = grad.reshape(-1)
        if self._adam is not None:  # the Adam take-over: the gradient or momentum to send
            settings = adam_settings(self._param_group[p])
            x = self._adam.before_exchange(_OPS, x, self._tensor_state[info.name], settings,
                                           p.detach().reshape(-1))
            info.dense = not self._adam.frozen(settings)
        if self.gradient_predivide_factor != 1.0:
            x = x / self.gradient_predivide_factor
        gid = self._group_of[p]
        entries = self._prepared.setdefault(gid, [])
        entries.append((p, x, info) if gid in self._buckets else   # compressed with its bucket
                       self._exchange.compress(p, x, self._tensor_state[info.name], info))
        if len(entries) == self._group_size[gid]:
            self._launch(gid)

    def _launch(self, gid) -> None:
        """Start the exchange of a group: its entries, or its bucket compressed as one."""
        entries, bucket = self._prepared.pop(gid), self._buckets.get(gid)
        if bucket is not None:
            state = self._tensor_state[bucket.name]
            if self._scaler is not None:
                self._scaler.guard.save(bucket.name, state)
            entries = [compress_bucket(self._exchange, bucket, entries, state)]
        self._inflight.append(self._exchange.start(entries))

    @staticmethod
    def _decode_buffer(entry) -> Optional[torch.Tensor]:
        """A dense contiguous gradient is the decoder's output buffer (no allocation); a fused
        bucket decodes into a buffer of its own, then cut into its gradients."""
        grad = getattr(entry.key, "grad", None)
        return None if grad is None or grad.is_sparse or not grad.is_contiguous() else grad.view(-1)

    def _finish(self, flight) -> None:
        """Wait for one launched group (and its further rounds) and write its gradients."""
        for entry in self._exchange.finish(flight, self._decode_buffer):
            in_place = self._decode_buffer(entry) is not None
            for p, total in totals(_OPS, entry):
                if total is None or in_place:
                    continue  # empty, or decoded and scaled in p.grad already
                grad = total.view(p.shape).to(p.dtype)
                if p.grad.is_sparse:
                    p.grad = grad.to_sparse()
                else:
                    p.grad.copy_(grad)

    def synchronize(self) -> None:
        """Wait for every gradient's communication and write the averaged gradients."""
        if not self._included():
            self._synchronized = True
            return
        handled = self._handled()
        for p in [q for q in self._requires_update if q not in handled]:
            self._delay[p] = 0
            self._ready(p)
        for gid in sorted(self._prepared, key=str):  # groups whose members did not all report
            self._launch(gid)
        overflow = self._scaler.launch(self._comm) if self._scaler is not None else None
        while self._inflight:
            self._finish(self._inflight.pop(0))
        if overflow is not None:
            self._overflow = self._scaler.settle(self._comm, overflow)
        for p, finish in self._sparse.items():
            p.grad = finish()  # Horovod's sparse allreduce hands back a function
        self._sparse.clear()
        if self.clip_grad_norm is not None and not self._clips_before():  # Horovod's clip, exactly
            # _requires_update is in name order: every rank sums the norms in the same order
            clip_gradients([p.grad for p in self._requires_update if p.grad is not None], self.clip_grad_norm)
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step
        self._exchange.end_step()
        self._watch.record(self._requires_update)
        self._synchronized = True

    def _handled(self) -> set:
        """Parameters already compressed this step (their delay counter reached 0)."""
        return {p for p, left in self._delay.items() if left == 0}

    @contextmanager
    def skip_synchronize(self):
        """Use after an explicit ``synchronize()``, so that ``step()`` does not wait again."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._plain_step:  # broadcast_optimizer_state initialising the wrapped optimizer
            return self._wrapped_step(closure)
        self._warn_unscaled_amp()
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after "
                              "optimizer.synchronize(); this synchronizes twice")
            self.synchronize()
        else:
            self._watch.check(self._parameter_names)
        self._synchronized = False
        if self._scaler is not None and self._included():
            if self._overflow:   # some rank overflowed: no update, no compressor step, anywhere
                return None
            for attr in ("grad_scale", "found_inf"):   # set by GradScaler.step: unscaled, finite
                if hasattr(self, attr):
                    setattr(self, attr, None)
        result = self._wrapped_step(closure)
        self._compression.on_step()
        if self._included():
            self._check_replicas()
        return result

    def _warn_unscaled_amp(self) -> None:
        """Once: ``step()`` runs inside ``GradScaler.step`` without ``scaler=`` while the
        compressor carries state, which then holds scaled gradients (hvdcompress.loss_scale)."""
        carrier = self._watch.carrier
        if self._scaler is not None or self._amp_warned or carrier is None or not inside_grad_scaler():
            return
        self._amp_warned = True
        self._watch.warned = True   # its warning would be about the scaler's unscale_, this one's subject
        warnings.warn(
            f"optimizer.step() runs inside torch.amp.GradScaler.step, but this hvdcompress "
            f"optimizer has no scaler=: {carrier.name}, which {what_it_keeps(carrier)}, then "
            "carries scaled gradients from step to step, so every change of the loss scale "
            "distorts its state (unscale_ after synchronize() divides only the current step) and "
            "an overflow step that the scaler skips still advances it. Pass scaler=<your "
            "GradScaler> to hvdcompress.torch.DistributedOptimizer (it unscales each gradient "
            "before compression and undoes overflow steps on every rank) and drop "
            "scaler.unscale_(optimizer); see docs/mixed_precision.md.", stacklevel=4)

    def _check_replicas(self) -> None:
        """Every ``check_replicas`` steps, compare the parameters and the compressor's counters
        across the process set (:mod:`hvdcompress.replicas`)."""
        names = [self._parameter_names[p] for p in self._by_name]
        self._replicas.after_step(
            lambda: list(zip(names, self._by_name)),
            lambda: counters_checksum(self._compression.state_dict(),
                                      [(name, self._tensor_state[name]) for name in names + sorted(self._buckets)]))

    def _wrapped_step(self, closure):
        """The wrapped optimizer's own step, with the settings the compressor took over at 0;
        with the Adam take-over, its update from the exchanged gradient or momentum instead."""
        if self._adam is not None and self._included() and not self._plain_step:
            return self._adam_step(closure)
        with suspended(self, takes_over(self._compression, self) and self._included()):
            return super(self.__class__, self).step(closure)

    def _adam_step(self, closure):
        """:meth:`hvdcompress.adam.FrozenAdam.after_exchange` for every parameter with a
        gradient, with its param group's settings read now (schedulers keep working)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for i, group in enumerate(self.param_groups):
                settings = adam_settings(group, i)
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if p.grad.is_sparse:
                        raise ValueError(f"parameter '{self._parameter_names[p]}' has a sparse "
                                         "gradient, which FrozenAdam cannot take; use sparse_as_dense=True")
                    new = self._adam.after_exchange(_OPS, self._tensor_state[self._parameter_names[p]],
                                                    p.reshape(-1), p.grad.reshape(-1), settings)
                    p.copy_(new.view_as(p))
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._prepared or self._inflight or self._sparse or self._awaiting_clip:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(); this would race with "
                                 "the gradients' communication")
        super(self.__class__, self).zero_grad(set_to_none=set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        if isinstance(passes, bool) or not isinstance(passes, int) or passes <= 0:
            raise ValueError(f"backward_passes_per_step={passes!r}: allowed: an integer >= 1")
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes

    def _clear_pending(self) -> None:
        """Forget any step in progress (a checkpoint load, an elastic reset)."""
        self._prepared.clear()
        self._awaiting_clip.clear()
        self._inflight.clear()
        self._sparse.clear()
        self._synchronized = False
        self._should_synchronize = True
        self.set_backward_passes_per_step(self.backward_passes_per_step)

    def rebuild(self) -> None:
        """Rebuild the exchange for Horovod's current world, after ``hvd.shutdown(); hvd.init()``
        at another size (an elastic reset, :mod:`hvdcompress.torch.elastic`): a new engine (the
        collective of every tensor planned again for the new number of ranks), the replica
        guard, and the rank agreement, a collective that a rank joining the run makes in its
        constructor at the same point. The compressor state is not touched: load a gathered
        :meth:`state_dict` to lay it out for the new world."""
        if self.process_set is not hvd.global_process_set:
            raise ValueError("rebuild: this optimizer runs over a process set, which does not "
                             "survive hvd.shutdown(); elastic training needs the global process set")
        if isinstance(self._compression, Planner):
            raise ValueError("rebuild: compression='auto' plans for one world size and link; "
                             "elastic training needs a fixed compressor")
        self._clear_pending()
        total = self._exchange.total_bytes
        self._build_exchange()
        self._exchange.total_bytes = total
        if self._included():
            self._check_ranks_agree()


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Optional[Iterable] = None,
                         compression: Union[Compressor, Mapping, str, None] = None,
                         backward_passes_per_step: int = 1, op=hvd.Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups=None, sparse_as_dense: bool = False,
                         process_set=hvd.global_process_set,
                         clip_grad_norm: Optional[float] = None,
                         collective: str = "auto", intra_node: Union[Compressor, Mapping, None] = None,
                         ranks_per_node: Optional[int] = None,
                         check_replicas: Optional[int] = None, auto_allowed=None,
                         link=None, scaler: Optional[torch.amp.GradScaler] = None,
                         fusion: Union[bool, int, None] = None) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that gradients are compressed, exchanged and averaged over ranks.

    Arguments are those of ``horovod.torch.DistributedOptimizer``; ``compression`` takes an
    hvdcompress compressor (default: none) or a dict for :func:`hvdcompress.from_params`.
    The returned object is an instance of the optimizer's own class with ``synchronize()``,
    ``skip_synchronize()``, ``last_step_bytes`` / ``total_bytes`` (:class:`ByteCount`: dense vs
    sent bytes of this rank) and a ``state_dict()`` that includes the compressor's state.
    ``op`` is ``hvd.Average`` or ``hvd.Sum`` (Adasum does not combine with compression).
    ``_parameter_names`` maps each parameter to its name, as on Horovod's optimizer
    (``allreduce.noname.{i}`` without ``named_parameters``).

    ``clip_grad_norm=c``: the way to clip gradients with compression. With a compressor that
    owns the momentum or keeps a residual (DGC, CSC, error feedback, PowerSGD, ``Momentum``),
    each rank clips its own local gradients (all of this optimizer's, after
    ``backward_passes_per_step`` accumulations) by their global L2 norm, before error feedback,
    momentum correction and compression: the local gradient clipping of the DGC paper (Lin et
    al. 2018, sec. 3.3), whose limit c/sqrt(N) on each rank's share g/N of the update is
    ``c * sqrt(N)`` on ``p.grad`` with op=Average (``c / sqrt(N)`` with op=Sum; N ranks in the
    process set); compression then waits until the last gradient of the step is ready, so it no
    longer overlaps the backward pass. With a stateless compressor the exchanged gradients
    are clipped to ``c`` at the end of ``synchronize()``, exactly Horovod's
    ``clip_grad_norm_`` after ``synchronize()`` (:mod:`hvdcompress.clipping` says why). Clipping
    ``p.grad`` between ``synchronize()`` and ``step()`` yourself is right for stateless
    compressors, but with one that owns the momentum or keeps a residual it clips the exchanged
    update: that case warns once.

    ``collective``: how payloads that cannot be summed travel: ``"auto"`` (default: the
    compressed allreduce, all-to-all of compressed segments, for the quantisers at 3 ranks or
    more, where it sends 2(P-1)/P of a payload instead of the allgather's P-1; allgather
    otherwise), ``"allgather"`` or ``"alltoall"`` (a ValueError for a compressor that cannot run
    it). See :mod:`hvdcompress.collectives` for the cost model; rank 0 logs the plan once.

    ``intra_node``: two-level compression (:mod:`hvdcompress.two_level`). None (default): the
    flat exchange over ``process_set``. A mild compressor (``NoCompression()``: full precision,
    ``FP16()``, ``BF16()``, ``Int8()``): each node reduce-scatters the gradients with it, each
    local rank exchanges its shard between nodes with ``compression`` (by the collective that
    ``collective`` picks for the shard at the number of nodes), and the node all-gathers the
    result: inter-node bytes divide by the ranks per node. ``ranks_per_node`` (default Horovod's
    local size) must divide the world size; the node and cross-node process sets must be
    registered on every rank: ``hvd.init(process_sets=hvdcompress.torch.node_process_sets())``
    (or HOROVOD_DYNAMIC_PROCESS_SETS=1, and the optimizer registers them). A compressor that
    takes the momentum over applies it to the node-summed shard. ``last_step_bytes`` then
    counts the bytes sent between nodes.

    ``check_replicas=N``: after every N-th ``step()``, compare a 64-bit checksum of every
    parameter's bits and of the compressor's step counters across the process set (one
    allgather of 8 bytes per parameter), and raise
    :class:`hvdcompress.replicas.ReplicaMismatch` on every rank, naming the first differing
    parameter, the step and which ranks disagree. Default: the environment variable
    ``HVDCOMPRESS_CHECK_REPLICAS``, else off (see :mod:`hvdcompress.replicas`).

    ``compression="auto"``: per tensor, the compressor and collective the cost model predicts
    fastest, from ``auto_allowed`` (default the accuracy-safe none, fp16, bf16, int8), on the
    link measured over the process set at the first exchange or given as ``link=`` (e.g.
    ``{"bandwidth": "10gbit", "latency": "50us"}``); see :mod:`hvdcompress.auto` and
    docs/auto.md. The :class:`~hvdcompress.auto.Auto` is ``optimizer._compression``.

    ``scaler=``: the ``torch.amp.GradScaler`` of mixed-precision training. Each gradient is
    divided by the current loss scale before compression, so residuals, momenta and factors
    hold unscaled gradients and the result does not depend on the scale; a step on which any
    rank's gradients hold an inf/NaN leaves the compressor state exactly as before and is
    skipped on every rank, and the scaler lowers its scale on every rank alike. Train with
    ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()`` (or ``opt.synchronize()``,
    then ``with opt.skip_synchronize(): scaler.step(opt)``), without ``scaler.unscale_(opt)``:
    the gradients are unscaled already, and the scaler knows it. Costs: a copy of the
    compressor state per step, one allreduce of one number, one host read of it (see
    :mod:`hvdcompress.loss_scale` and docs/mixed_precision.md). Without ``scaler=``, a
    compressor that carries state inside ``GradScaler.step`` warns once.

    ``fusion=B``: fused compression (:mod:`hvdcompress.fusion`): consecutive parameters in name
    order, of one dtype and param group, up to ``B`` bytes (``True``: 64 MiB, Horovod's fusion
    buffer), are compressed as one flat buffer and sent in one collective per round, so a model
    of many small tensors pays each collective's latency and each codec call once per bucket.
    A bucket is sent once its last gradient is ready; its compressor state is kept under the
    bucket's name (``fused[first..last]``). Not with ``groups`` or PowerSGD.

    A rank outside ``process_set`` builds the optimizer, does no collective for it, and its
    ``step()`` applies its own local gradients with the wrapped optimizer, as Horovod's does.
    """
    options = parse_options(compression, op=op, average_op=hvd.Average, sum_op=hvd.Sum,
                            backward_passes_per_step=backward_passes_per_step,
                            gradient_predivide_factor=gradient_predivide_factor,
                            num_groups=num_groups, groups=groups, sparse_as_dense=sparse_as_dense,
                            clip_grad_norm=clip_grad_norm, collective=collective,
                            intra_node=intra_node, ranks_per_node=ranks_per_node,
                            check_replicas=check_replicas, process_set=process_set,
                            global_set=hvd.global_process_set, auto_allowed=auto_allowed, link=link,
                            # a disabled GradScaler (enabled=False) scales nothing: as none
                            scaler=None if isinstance(scaler, torch.amp.GradScaler) and not scaler.is_enabled() else scaler,
                            scaler_types=(torch.amp.GradScaler,), fusion=fusion)
    methods = {k: v for k, v in vars(CheckpointMethods).items() if not k.startswith("__")}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               {**methods, **vars(_DistributedOptimizer)})
    wrapped = cls(optimizer.param_groups, named_parameters, options, process_set,
                  dict(optimizer.defaults))
    wrapped.state.update(optimizer.state)
    return wrapped
