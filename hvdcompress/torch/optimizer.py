"""hvdcompress.torch.DistributedOptimizer: Horovod's DistributedOptimizer with compression.

Same signature and behaviour as ``horovod.torch.DistributedOptimizer``, plus ``compression=``
and the shared arguments of :mod:`hvdcompress.step.arguments`. This module is the torch/Horovod front
end of the step driver (:mod:`hvdcompress.step.driver`), which decides everything around the
engine: it owns the gradient hooks, ``p.grad`` and Horovod's collectives, nothing else.

Per parameter, once its gradient has been accumulated ``backward_passes_per_step`` times, a
hook hands it to the driver; a group is launched when its last member is ready.
``synchronize()`` (called by ``step()``) decodes into ``p.grad`` (no per-step allocation), then
the wrapped optimizer steps. ``p.grad is None`` sends zeros (as Horovod); integer/complex
gradients raise ``TypeError``; sparse gradients are densified with ``sparse_as_dense=True``,
else sent uncompressed through Horovod's sparse allreduce.
"""
from __future__ import annotations

import warnings
from collections import Counter
from typing import Iterable, Mapping, Optional, Union

import horovod.torch as hvd
import torch

from ..contract.compressor import Compressor
from ..engines.selection import build_exchange
from ..step.arguments import documented
from ..step.driver import Completion, StepDriver
from ..step.names import check_names
from ..step.options import check_unwrapped, parse_options
from .checkpoints import CheckpointMethods
from .clipping import GradientWatch
from .collectives import HorovodCollectives
from .fusion import bucket_tensors
from .grad_scaler import GradScalerLink, enabled_scaler, warn_unscaled_amp
from .momentum_takeover import check_adam, check_momentum, suspended, takes_over
from .optimizer_steps import OptimizerSteps
from .tensors import OPS, adam_update, ranks_of, weak_hook


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed into the wrapped optimizer's class by :func:`DistributedOptimizer`."""

    def __init__(self, params, named_parameters, options, process_set, defaults=None):
        try:
            super(self.__class__, self).__init__(params, **(defaults or {}))
        except TypeError:
            super(self.__class__, self).__init__(params)
        self._options = options
        self._compression = compression = options.compressor
        self._parameter_names = check_names(named_parameters, [p for g in self.param_groups for p in g["params"]])
        #: every parameter in name order: every loop over several tensors runs in it (the same on every rank)
        self._by_name = sorted(self._parameter_names, key=lambda p: self._parameter_names[p])
        self.backward_passes_per_step = options.backward_passes_per_step
        self.op = hvd.Average if options.average else hvd.Sum
        self.gradient_predivide_factor = options.predivide
        self.sparse_as_dense = options.sparse_as_dense
        self.process_set = process_set
        self.clip_grad_norm = options.clip_grad_norm
        comm = self._comm = HorovodCollectives(process_set)
        check_momentum(compression, self)   # no reference back to self: old optimizers are collectable
        self._driver = StepDriver(options, OPS, weak_hook(self, "_new_engine"), lambda: comm,
                                  "hvdcompress.torch.DistributedOptimizer", adam=check_adam(compression, self),
                                  ranks=ranks_of(process_set, hvd.global_process_set))
        self._watch = GradientWatch(compression, options.intra_node)  # the clip-after-synchronize trap
        self._scaler = GradScalerLink(options.scaler, self) if options.scaler is not None else None
        self._driver.guard = self._scaler.guard if self._scaler is not None else None
        self._overflow = self._amp_warned = False   # the last step overflowed (scaler=); AMP warned
        #: fusion=: bucket name -> Bucket of trainable parameters compressed as one
        self._buckets = {b.name: b for b in options.buckets(bucket_tensors(
            ((self._parameter_names[p], p) for p in self._by_name), self.param_groups))}
        for name in [*self._parameter_names.values(), *self._buckets]:
            self._driver.states.tensor(name)
        self._delay = {p: self.backward_passes_per_step for p in self._parameter_names}
        self._requires_update = [p for p in self._by_name if p.requires_grad]
        ids = options.group_ids(list(self._parameter_names.values()), self._name_in_groups)
        ids.update({member: b.name for b in self._buckets.values() for member in b.members})
        self._group_of = {p: ids[name] for p, name in self._parameter_names.items()}
        self._driver.completion = Completion(Counter(self._group_of[p] for p in self._requires_update))
        self._driver.describe((self._parameter_names[p], p.shape, p.dtype) for p in self._by_name)
        self._param_group = {p: g for g in self.param_groups for p in g["params"]}
        self._steps = OptimizerSteps(self)   # the step's sequence (hvdcompress.step.frontend)
        self._synchronized, self._should_synchronize, self._plain_step = False, True, False
        if self._included():  # a rank outside the process set does no collective (as Horovod)
            self._agree()
            for p in self._requires_update:
                p.register_post_accumulate_grad_hook(weak_hook(self, "_hook"))
            # GradScaler.step calls step() without looking at found_inf, which is known only
            # after the exchange; step() skips the update itself
            self._step_supports_amp_scaling = self._scaler is not None

    def _new_engine(self):
        o = self._options
        return build_exchange(hvd, HorovodCollectives, self.process_set, self._compression, OPS,
                              intra_node=o.intra_node, ranks_per_node=o.ranks_per_node, average=o.average,
                              predivide=o.predivide, collective=o.collective)

    def _agree(self) -> None:
        self._driver.agree(None, torch.zeros(1))

    _exchange = property(lambda self: self._driver.engine)
    _tensor_state = property(lambda self: self._driver.states)

    def _included(self) -> bool:
        return self._comm.included()

    last_step_bytes = property(lambda self: self._driver.last_step_bytes,
                               doc="This rank's dense versus sent bytes of the last step (ByteCount).")
    total_bytes = property(lambda self: self._driver.total_bytes,
                           doc="This rank's dense versus sent bytes since construction (ByteCount).")

    def _name_in_groups(self, p) -> str:
        if not isinstance(p, torch.Tensor) or p not in self._parameter_names:
            raise ValueError("groups must be a list of lists of this optimizer's parameters")
        return self._parameter_names[p]

    # ---- hooks and communication -----------------------------------------------------------------
    def _hook(self, p: torch.Tensor) -> None:
        if self._delay[p] <= 0:
            raise AssertionError("gradients were computed more than backward_passes_per_step times "
                                 "before step() or synchronize(); increase backward_passes_per_step")
        self._delay[p] -= 1
        if self._delay[p] == 0:
            self._steps.ready([p])

    def synchronize(self) -> None:
        """Wait for every gradient's communication and write the averaged gradients."""
        if not self._included():
            self._synchronized = True
            return
        for p in [q for q in self._requires_update if self._delay[q] != 0]:
            self._delay[p] = 0
            self._steps.ready([p])
        self._overflow = self._steps.wait()
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step
        self._watch.record(self._requires_update)
        self._synchronized = True

    def step(self, closure=None):
        if self._plain_step:  # broadcast_optimizer_state initialising the wrapped optimizer
            return self._wrapped_step(closure)
        warn_unscaled_amp(self)
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
        self._steps.updated(named=(lambda: [(self._parameter_names[p], p) for p in self._by_name])
                            if self._included() else None)
        return result

    def _wrapped_step(self, closure):
        """The wrapped optimizer's own step, with the settings the compressor took over at 0;
        with the Adam take-over, its update from the exchanged gradient or momentum instead."""
        if self._driver.adam is not None and self._included() and not self._plain_step:
            return adam_update(self._driver.adam, self.param_groups,
                               lambda p: self._driver.states.tensor(self._parameter_names[p]),
                               self._parameter_names.get, closure)
        with suspended(self, takes_over(self._compression, self) and self._included()):
            return super(self.__class__, self).step(closure)

@documented("compression", "clip_grad_norm", "collective", "intra_node", "check_replicas", "auto",
            "scaler", "fusion", "bytes")
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

    Arguments are those of ``horovod.torch.DistributedOptimizer`` plus the shared ones below.
    The returned object is an instance of the optimizer's own class with ``synchronize()``,
    ``skip_synchronize()``, ``last_step_bytes`` / ``total_bytes`` and a ``state_dict(gather=False)``
    that includes the compressor's state (:mod:`hvdcompress.state.store`). ``op`` is
    ``hvd.Average`` or ``hvd.Sum`` (Adasum does not combine with compression).
    ``_parameter_names`` maps each parameter to its name, as on Horovod's optimizer. Two-level
    compression needs the node process sets registered on every rank:
    ``hvd.init(process_sets=hvdcompress.torch.node_process_sets())``. With ``scaler=``, train with
    ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()`` (or ``opt.synchronize()``,
    then ``with opt.skip_synchronize(): scaler.step(opt)``). A rank outside ``process_set``
    does no collective; its ``step()`` applies its own gradients, as Horovod's does.
    """
    check_unwrapped("hvdcompress.torch.DistributedOptimizer", "optimizer", optimizer)
    options = parse_options(compression, op=op, average_op=hvd.Average, sum_op=hvd.Sum,
                            backward_passes_per_step=backward_passes_per_step,
                            gradient_predivide_factor=gradient_predivide_factor,
                            num_groups=num_groups, groups=groups, sparse_as_dense=sparse_as_dense,
                            clip_grad_norm=clip_grad_norm, collective=collective,
                            intra_node=intra_node, ranks_per_node=ranks_per_node,
                            check_replicas=check_replicas, process_set=process_set,
                            global_set=hvd.global_process_set, auto_allowed=auto_allowed, link=link,
                            scaler=enabled_scaler(scaler), scaler_types=(torch.amp.GradScaler,), fusion=fusion)
    methods = {k: v for k, v in vars(CheckpointMethods).items() if not k.startswith("__")}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               {**methods, **vars(_DistributedOptimizer)})
    wrapped = cls(optimizer.param_groups, named_parameters, options, process_set,
                  dict(optimizer.defaults))
    wrapped.state.update(optimizer.state)
    return wrapped

