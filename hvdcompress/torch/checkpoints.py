"""Checkpoints, resets and step control of hvdcompress.torch.DistributedOptimizer: its ``state_dict`` (one
rank's or gathered), ``load_state_dict`` (at the same world size, or redistributed to another
one: :mod:`hvdcompress.state.store`), ``rebuild`` after a world change, ``zero_grad``,
``skip_synchronize``, ``set_backward_passes_per_step``, and :func:`broadcast_optimizer_state`.

:class:`CheckpointMethods` holds these methods; the optimizer's class is built per wrapped
optimizer (:func:`hvdcompress.torch.optimizer.DistributedOptimizer`), with them beside its own.
"""
from __future__ import annotations

from contextlib import contextmanager

import horovod.torch as hvd
import torch

from ..state import store as state_store
from .tensors import CONVERSIONS, state_layout


class CheckpointMethods:
    """The checkpoint, reset and step-control methods of the wrapped optimizer (they read its
    driver, names and buckets)."""

    def state_dict(self, gather: bool = False) -> dict:
        """The wrapped optimizer's state plus ``'hvdcompress'``: the format version, the compressor
        tree and the parameters' names, shapes and dtypes (what a load is checked against), the
        compressor's own state, the world size and op, and every tensor's buffers keyed by
        parameter name: this rank's
        (``'tensors'``), or with ``gather=True`` every rank's (``'ranks'``, CPU tensors, in rank
        order; a collective). A gathered checkpoint resumes at any world size with the unsent
        error-feedback mass and the mean momentum kept (:mod:`hvdcompress.state.reshard`); one rank's
        resumes at the same world size only."""
        sd = super(self.__class__, self).state_dict()
        sd["hvdcompress"] = state_store.save(self._driver, CONVERSIONS, gather and self._included(), torch.zeros(1))
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a :meth:`state_dict`, gathered or one rank's, all or nothing: the compressor's
        part is checked whole and built first (:func:`hvdcompress.state.store.prepare`), then the
        wrapped optimizer's state is loaded, then the compressor's is assigned; a refused
        checkpoint (a ``ValueError`` naming the entry) leaves both as they were. A checkpoint
        without ``'hvdcompress'`` loads the wrapped optimizer's state alone. Local: no collective."""
        state_dict = dict(state_dict)
        own = state_dict.pop("hvdcompress", None)
        commit = None if own is None else state_store.prepare(
            self._driver, own, CONVERSIONS, self._driver.states.named(), self._layout)
        super(self.__class__, self).load_state_dict(state_dict)
        self._clear_pending()
        if commit is not None:
            commit()

    def _layout(self, name: str) -> tuple:
        """(numel, a tensor on its device, whether it runs as a compressed allreduce) of the
        tensor whose state is kept under ``name``: a parameter, or a fused bucket."""
        by_name = {n: p for p, n in self._parameter_names.items()}
        bucket = self._buckets.get(name)
        params = [by_name[m] for m in bucket.members] if bucket is not None else [by_name[name]]
        return state_layout(self._driver, params, bucket, self._steps.info)

    @contextmanager
    def skip_synchronize(self):
        """Use after an explicit ``synchronize()``, so that ``step()`` does not wait again."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._steps.in_progress:
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
        self._steps.forget()
        self._synchronized = False
        self._should_synchronize = True
        self.set_backward_passes_per_step(self.backward_passes_per_step)

    def rebuild(self) -> None:
        """Rebuild for Horovod's current world after ``hvd.shutdown(); hvd.init()`` at another
        size (an elastic reset, :mod:`hvdcompress.torch.elastic`): a new engine
        (:meth:`hvdcompress.step.driver.StepDriver.rebuild`), then the rank agreement, a collective
        that a joining rank makes in its constructor at the same point. The compressor state is
        not touched: load a gathered :meth:`state_dict` to lay it out for the new world."""
        self._driver.rebuild(None if self.process_set is hvd.global_process_set
                             else "this optimizer runs over a process set")
        self._clear_pending()
        if self._included():
            self._agree()


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              process_set=hvd.global_process_set) -> None:
    """``hvd.broadcast_optimizer_state`` for an hvdcompress optimizer, plus the compressor's
    schedule state (step, epoch), so that ranks restarted from rank 0's checkpoint agree.

    Horovod's version initialises an empty optimizer state by running ``step()`` on zero
    gradients; here that step is the wrapped optimizer's alone (no exchange, no compressor
    step). Per-tensor compressor state (residuals) is per rank by nature and not broadcast.
    """
    if not hasattr(optimizer, "_compression"):
        raise TypeError(f"broadcast_optimizer_state: {type(optimizer).__name__} is not an "
                        "hvdcompress DistributedOptimizer; use hvd.broadcast_optimizer_state")
    optimizer._plain_step = True
    try:
        hvd.broadcast_optimizer_state(optimizer, root_rank)
    finally:
        optimizer._plain_step = False
        for p in optimizer._parameter_names:
            p.grad = None
    state = hvd.broadcast_object(optimizer._compression.state_dict(), root_rank,
                                 name="hvdc.compressor_state", process_set=process_set)
    optimizer._compression.load_state_dict(state)
