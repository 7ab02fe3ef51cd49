"""Horovod elastic training with compression: :class:`TorchState` for ``hvd.elastic.run``.

::

    import horovod.torch as hvd
    import hvdcompress.torch as hvc
    from hvdcompress.torch.elastic import TorchState

    hvd.init()
    opt = hvc.DistributedOptimizer(torch.optim.SGD(...), named_parameters=..., compression=...)
    state = TorchState(model=model, optimizer=opt, batch=0)   # in place of hvd.elastic.TorchState

    @hvd.elastic.run
    def train(state):
        ...; opt.step(); state.batch += 1; state.commit()

Build the optimizer before any other collective of the script: a rank that joins runs the
optimizer's rank agreement (a collective) in its constructor while the ranks already there
run it in their reset; the two must meet.

What the compressed optimizer's state does at each event of ``hvd.elastic.run``:

* ``commit()`` (save): every rank's compressor state is gathered (``state_dict(gather=True)``,
  one allgather of the residuals and momenta), so that a rank that leaves does not take its
  unsent error-feedback mass with it. Commit as often as a lost step costs more than this.
* reset (ranks added or removed; after a failure): every rank still there rebuilds the exchange
  for the new world size (:meth:`rebuild`: the collectives planned again, e.g. the compressed
  allreduce's P segments, the replica guard, the rank agreement) and loads the last commit's
  gathered state, laid out for the new world by :mod:`hvdcompress.state.reshard`: every rank then
  holds Σ_r e_r / P of each residual and momentum, so the mass the exchanged mean carries is
  kept (op=Average; Σ_r e_r / P' with op=Sum). Local: no collective besides the agreement.
* ``sync()`` (after every reset; Horovod skips it after a removal, :mod:`hvdcompress.step.elastic`
  says why this state does not): the wrapped optimizer's state and the compressor's counters
  from rank 0 (:func:`hvdcompress.torch.broadcast_optimizer_state`), then rank 0's last gathered
  commit, loaded by every rank: a joining rank gets the same share as the others.
* ``restore()`` (a failure): the last commit's state.

``hvd.elastic.TorchState`` alone handles the wrapped optimizer but not the exchange: after a
reset its plan would be the old world's, and the ranks would disagree on the collectives.

A :class:`hvdcompress.torch.DiLoCo` given to ``TorchState`` (commit after each outer sync,
``opt.synced``) is handled alike: the commit gathers its error feedback, a reset rebuilds its
exchange for the new number of sites and lays the commit out for it, and ``sync()`` gives every
site rank 0's anchor, outer momentum and step; a site that joins takes rank 0's inner optimizer
state too, while the sites already there keep their own (each site's inner optimizer is its own).
"""
from __future__ import annotations

import copy

import horovod.torch as hvd
from horovod.torch.elastic.state import StateHandler, get_handler_registry, set_handler_registry

from ..step.elastic import SyncEveryReset
from .checkpoints import broadcast_optimizer_state
from .diloco import DiLoCo


def _compressed(value) -> bool:
    """Whether ``value`` is an hvdcompress torch optimizer."""
    return hasattr(value, "_compression") and callable(getattr(value, "rebuild", None))


class CompressedOptimizerHandler(StateHandler):
    """The elastic state handler of an hvdcompress optimizer (see the module doc)."""

    def __init__(self, optimizer):
        super().__init__(optimizer)
        # this rank's state only: a joining rank builds its state while the others reset
        self._saved = copy.deepcopy(optimizer.state_dict())

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict(gather=True))

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def reset(self) -> None:
        """Horovod was initialised again, at another size: rebuild the exchange, lay the last
        commit's state out for the new world."""
        self.value.rebuild()
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)
        own = hvd.broadcast_object(self._saved["hvdcompress"], root_rank=0, name="hvdc.elastic.state")
        state = self.value.state_dict()
        state["hvdcompress"] = own
        self.value.load_state_dict(state)
        self._saved = copy.deepcopy(state)   # a reset before the next commit starts from it again


class DiLoCoHandler(CompressedOptimizerHandler):
    """The elastic state handler of a :class:`hvdcompress.torch.DiLoCo` (see the module doc)."""

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self._joined = False   # False until this site holds a commit or a sync: it starts afresh

    def save(self) -> None:
        super().save()
        self._joined = True

    def sync(self) -> None:
        state = hvd.broadcast_object(self._saved, root_rank=0, name="hvdc.elastic.diloco")
        if self._joined:
            state = {**state, "inner": self.value.inner.state_dict()}
        self.value.load_state_dict(state)
        self._saved, self._joined = copy.deepcopy(state), True


# Horovod's TorchState picks a handler by type, in its registry's order, and keeps anything else
# as a plain object (broadcast by pickling): a DiLoCo, not a torch Optimizer, is registered first.
if not any(kind is DiLoCo for kind, _ in get_handler_registry()):
    set_handler_registry([(DiLoCo, DiLoCoHandler), *get_handler_registry()])


class TorchState(SyncEveryReset, hvd.elastic.TorchState):
    """``hvd.elastic.TorchState`` whose hvdcompress optimizers (any keyword argument) keep their
    exchange and compressor state across resets (see the module doc)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        super().__init__(model=model, optimizer=optimizer, **kwargs)
        for name, handler in list(self._handlers.items()):
            if _compressed(handler.value):
                self._handlers[name] = CompressedOptimizerHandler(handler.value)

    def reset(self) -> None:
        for handler in self._handlers.values():
            if isinstance(handler, CompressedOptimizerHandler):
                handler.reset()
        super().reset()
