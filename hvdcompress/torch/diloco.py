"""hvdcompress.torch.DiLoCo: train on every site alone, sync the sites every H steps.

    import hvdcompress.torch as hvc
    opt = hvc.DiLoCo(torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95)),
                     named_parameters=model.named_parameters(), sync_every=50)
    for x, y in batches:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

The torch front end of :mod:`hvdcompress.step.diloco` (the rule, its maths and its cost are
there): ``step()`` runs the inner optimizer, and every ``sync_every`` steps the outer sync
exchanges the pseudo-gradients with ``compression`` through the flat exchange engine, takes the
outer Nesterov step on the anchor and copies it into the parameters, on every rank alike.

Over Horovod (``horovodrun``; ``process_set=``: the ranks that sync, one per site or, with a
data-parallel inner optimizer over each site's ranks, those of one local index) or over
torch.distributed (``process_group=``; None: the default group when Horovod is not initialised).
The inner optimizer may itself be data parallel inside a site (``hvc.DistributedOptimizer`` over
the site's process set, or DDP over the site's group): DiLoCo only calls its ``step()``.
Learning-rate schedulers step the inner optimizer (``DiLoCo`` is not a ``torch.optim.Optimizer``).
The parameters must start equal on every rank (``hvd.broadcast_parameters``); the construction
checks it, with the settings, on every rank.

Elastic (``horovodrun --min-np/--max-np``, :class:`hvdcompress.torch.elastic.TorchState`): commit
after each sync (``opt.synced``), so that a site joins or leaves at a sync. At a reset every site
rebuilds the exchange for the new number of sites and takes the last commit's error feedback laid
out for it; a joining site takes rank 0's anchor, outer momentum, step and inner optimizer state,
and the parameters from rank 0 (the anchor: the commit was a sync). Under ``HOROVOD_ELASTIC`` the
starting parameters are not compared at construction: a joining site's come from rank 0 then.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Iterable, Mapping, Optional, Union

import torch

from ..contract.compressor import Compressor
from ..engines.accounting import ByteCount
from ..engines.selection import build_exchange, select_engine
from ..state import store as state_store
from ..step.diloco import DEFAULT_COMPRESSION, OuterSync, check_outer_compressor, outer_settings
from ..step.driver import StepDriver
from ..step.names import check_names
from ..step.options import parse_options
from .tensors import CONVERSIONS, OPS, ranks_of, state_layout, tensor_info

WHO = "hvdcompress.torch.DiLoCo"


def _horovod_running() -> bool:
    module = sys.modules.get("horovod.torch")
    return module is not None and module.is_initialized()


def _backend(process_group: Any, process_set: Any, compressor: Compressor,
             collective: str) -> tuple:
    """(engine factory, collectives factory, global ranks of the process set or None, why an
    elastic reset cannot rebuild it or None): the flat exchange over Horovod's ``process_set``,
    or over torch.distributed's ``process_group``."""
    if process_group is not None and process_set is not None:
        raise ValueError(f"{WHO}: process_group={process_group!r} and process_set={process_set!r}: "
                         "allowed: one of them (torch.distributed or Horovod), or neither")
    if process_group is None and (process_set is not None or _horovod_running()):
        import horovod.torch as hvd

        from .collectives import HorovodCollectives
        ps = hvd.global_process_set if process_set is None else process_set
        if not HorovodCollectives(ps).included():
            raise ValueError(f"{WHO}: this rank (global {hvd.rank()}) is not in process_set={ps}: "
                             "build DiLoCo only on the ranks of the process set that syncs")
        return (lambda: build_exchange(hvd, HorovodCollectives, ps, compressor, OPS, collective=collective),
                lambda: HorovodCollectives(ps), ranks_of(ps, hvd.global_process_set),
                None if ps is hvd.global_process_set else "DiLoCo runs over a process set")
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"{WHO}: no process group to sync over; allowed: after hvd.init() "
                         "(Horovod) or torch.distributed.init_process_group(...), or process_group=")
    from .dist_collectives import DistCollectives
    return (lambda: select_engine(compressor, OPS, DistCollectives(process_group), collective=collective),
            lambda: DistCollectives(process_group), None, "DiLoCo runs over torch.distributed")


class DiLoCo:
    """``inner_optimizer`` stepped on this site, its parameters synced every ``sync_every``
    steps (module doc; :mod:`hvdcompress.step.diloco`).

    ``named_parameters``: ``model.named_parameters()`` (names key the checkpoint; without them
    the optimizer's parameters are numbered). ``compression``: the outer sync's compressor
    (a Compressor or a dict for :func:`hvdcompress.from_params`; None:
    :data:`~hvdcompress.step.diloco.DEFAULT_COMPRESSION`; dense: ``hvdcompress.NoCompression()``). ``outer_lr``,
    ``outer_momentum``, ``nesterov``: the outer SGD. ``collective``: the engine's, as on the
    other front ends. ``check_replicas``: every that many syncs, compare every rank's
    parameters after the sync (they must be the same bits) and raise
    :class:`hvdcompress.ReplicaMismatch` on every rank, naming the tensor, if they are not
    (:mod:`hvdcompress.step.replicas`). Parameters that do not require a gradient are not synced.
    """

    def __init__(self, inner_optimizer: torch.optim.Optimizer, named_parameters: Optional[Iterable] = None,
                 sync_every: int = 50, compression: Union[Compressor, Mapping, str, None] = None,
                 outer_lr: float = 0.7, outer_momentum: float = 0.9, nesterov: bool = True,
                 process_group: Any = None, process_set: Any = None, collective: str = "auto",
                 check_replicas: Optional[int] = None):
        if not isinstance(inner_optimizer, torch.optim.Optimizer):
            raise ValueError(f"{WHO}: inner_optimizer={inner_optimizer!r}: allowed: a torch.optim.Optimizer")
        settings = outer_settings(WHO, sync_every, outer_lr, outer_momentum, nesterov)
        options = parse_options(DEFAULT_COMPRESSION if compression is None else compression,
                                op="average", average_op="average", sum_op="sum", collective=collective,
                                check_replicas=check_replicas)
        compressor = check_outer_compressor(WHO, options.compressor)
        self.inner = inner_optimizer
        params = [p for group in inner_optimizer.param_groups for p in group["params"]]
        names = check_names(named_parameters, params)
        #: name -> parameter, every synced one (trainable, not empty)
        self._params = {names[p]: p for p in params if p.requires_grad and p.numel()}
        engine, comm, ranks, self._blocker = _backend(process_group, process_set, compressor, options.collective)
        self._driver = StepDriver(options, OPS, engine, comm, WHO, ranks=ranks)
        for name in self._params:
            self._driver.states.tensor(name)
        with torch.no_grad():
            self._sync = OuterSync(self._driver, OPS, settings,
                                   ((n, p.detach().reshape(-1)) for n, p in self._params.items()),
                                   lambda t: t.detach().clone())
        self._agree()

    def _agree(self) -> None:
        """The rank agreement (a collective): the tensors, the settings and, but under Horovod's
        elastic mode (module doc), the starting parameters."""
        elastic = self._blocker is None and os.environ.get("HOROVOD_ELASTIC") == "1"
        self._sync.agree([(n, tuple(p.shape), str(p.dtype)) for n, p in self._params.items()],
                         torch.zeros(1, device=self._device()), parameters=not elastic)

    def rebuild(self) -> None:
        """Rebuild for Horovod's current world after ``hvd.shutdown(); hvd.init()`` at another
        number of sites (an elastic reset, :mod:`hvdcompress.torch.elastic`): a new engine and
        replica check, then the rank agreement, which a joining site makes in its constructor at
        the same point. The error feedback is laid out for the new world by loading a gathered
        :meth:`state_dict`."""
        self._driver.rebuild(self._blocker)
        self._agree()

    def _device(self) -> torch.device:
        """Where the agreement's bytes travel from: the parameters' device (NCCL's CUDA)."""
        first = next(iter(self._params.values()), None)
        return torch.device("cpu") if first is None else first.device

    # ---- the optimizer's interface ------------------------------------------------------------------
    param_groups = property(lambda self: self.inner.param_groups, doc="the inner optimizer's")
    state = property(lambda self: self.inner.state, doc="the inner optimizer's")
    sync_every = property(lambda self: self._sync.settings.sync_every)
    steps = property(lambda self: self._sync.step, doc="inner steps taken (checkpointed)")
    compressor = property(lambda self: self._driver.compressor, doc="the outer sync's compressor")
    synced = property(lambda self: self._sync.step % self._sync.settings.sync_every == 0,
                      doc="whether the last step() ended on an outer sync (or none was taken yet)")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The inner optimizer's ``zero_grad``: Horovod's ``DistributedOptimizer`` takes no
        argument (it sets the gradients to None, torch's default), so none is passed then."""
        if set_to_none:
            self.inner.zero_grad()
        else:
            self.inner.zero_grad(set_to_none=False)

    def step(self, closure: Optional[Callable] = None) -> Any:
        """The inner optimizer's step; then the outer sync when ``sync_every`` steps are done
        since the last one (a collective over the sites)."""
        loss = self.inner.step(closure)
        if self._sync.after_inner_step():
            self.sync()
        return loss

    def sync(self) -> None:
        """The outer sync now (``step()`` calls it every ``sync_every`` steps): every rank ends
        with the new anchor's bits in its parameters. A collective."""
        comm = self._driver.comm
        current = [(n, p.detach().reshape(-1), tensor_info(p, n, comm.world, comm.rank))
                   for n, p in self._params.items()]
        with torch.no_grad():
            for name, anchor in self._sync.sync(current):
                self._params[name].copy_(anchor.view_as(self._params[name]))
        self._driver.check_replicas(lambda: [(n, self._params[n].detach()) for n in sorted(self._params)])

    total_bytes = property(lambda self: self._sync.total_bytes, doc=(
        "ByteCount since construction: ``sent``, this rank's payloads of the outer syncs; ``dense``, "
        "what every-step data parallelism would have sent over the same inner steps"))

    @property
    def last_sync_bytes(self) -> ByteCount:
        """This rank's dense versus sent bytes of the last outer sync (one model's worth dense)."""
        return self._driver.last_step_bytes

    # ---- checkpoints ------------------------------------------------------------------------------------
    def state_dict(self, gather: bool = False) -> dict:
        """``'inner'``: the inner optimizer's state; ``'diloco'``: the step counter, every tensor's
        anchor and outer momentum; ``'hvdcompress'``: the compressor's state and the
        error-feedback residuals, this rank's or with ``gather=True`` every rank's (a collective;
        such a checkpoint resumes at another number of sites, :mod:`hvdcompress.state.store`)."""
        return {"inner": self.inner.state_dict(), "diloco": self._sync.state_dict(CONVERSIONS.host),
                "hvdcompress": state_store.save(self._driver, CONVERSIONS, gather, torch.zeros(1, device=self._device()))}

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Load a :meth:`state_dict` (the model's parameters are the model's own checkpoint: load
        them too, they are the sites' parameters since the last sync). Local: no collective."""
        missing = sorted({"inner", "diloco", "hvdcompress"} - set(state_dict))
        if missing:
            raise ValueError(f"{WHO}.load_state_dict: missing {missing}: allowed: a DiLoCo.state_dict()")
        self.inner.load_state_dict(state_dict["inner"])
        self._sync.load_state_dict(state_dict["diloco"], CONVERSIONS.copy)
        comm = self._driver.comm
        state_store.load(self._driver, state_dict["hvdcompress"], CONVERSIONS, self._params,
                         lambda name: state_layout(self._driver, [self._params[name]], None,
                                                   lambda p: tensor_info(p, name, comm.world, comm.rank)),
                         who=f"{WHO}.load_state_dict")
