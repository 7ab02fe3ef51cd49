"""Checkpoints of hvdcompress.torch.DistributedOptimizer: its ``state_dict`` (one rank's or
gathered), ``load_state_dict`` (at the same world size, or redistributed to another one by
:mod:`hvdcompress.reshard`), and :func:`broadcast_optimizer_state`.

:class:`CheckpointMethods` holds the optimizer's checkpoint methods; the optimizer's class is
built per wrapped optimizer (:func:`hvdcompress.torch.optimizer.DistributedOptimizer`), with
these methods beside its own.
"""
from __future__ import annotations

import horovod.torch as hvd
import numpy as np
import torch

from ..agreement import allgather_object
from ..fusion import bucket_info
from ..reshard import has_per_rank, share_of_rank, split_key
from .backend import TorchOps

_OPS = TorchOps()


class CheckpointMethods:
    """The checkpoint methods of the wrapped optimizer (they read its engine, names, buckets
    and per-tensor state)."""

    def state_dict(self, gather: bool = False) -> dict:
        """The wrapped optimizer's state plus ``'hvdcompress'``: the compressor's own state, the
        world size and op, and every tensor's buffers (residuals, momenta, velocities) keyed by
        parameter name: this rank's (``'tensors'``), or with ``gather=True`` every rank's
        (``'ranks'``, CPU tensors, in rank order).

        ``gather=True`` is a collective (every rank of the process set calls it; one allgather
        of the state): the checkpoint then resumes at any world size, by the rule of
        :mod:`hvdcompress.reshard` (the unsent error-feedback mass and the mean momentum are
        preserved). One rank's checkpoint holds that rank's residuals only: it resumes at the
        same world size, every rank then starting from that rank's state."""
        sd = super(self.__class__, self).state_dict()
        own = {"compressor": self._compression.state_dict(), "world": self._world(),
               "average": self.op == hvd.Average}
        if gather and self._included():
            mine = {name: {k: v.detach().cpu().clone() if torch.is_tensor(v) else v
                           for k, v in st.items()} for name, st in self._tensor_state.items()}
            own["ranks"] = allgather_object(mine, self._comm, _OPS, torch.zeros(1))
        else:
            own["tensors"] = {name: {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()}
                              for name, st in self._tensor_state.items()}
        sd["hvdcompress"] = own
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a :meth:`state_dict`. A gathered one (``gather=True``) is redistributed to this
        run's world size and this rank (:func:`hvdcompress.reshard.redistribute`); one rank's
        must come from a run of the same world size (a ``ValueError`` otherwise, when it holds
        per-rank state). Local: no collective."""
        state_dict = dict(state_dict)
        own = state_dict.pop("hvdcompress", None)
        super(self.__class__, self).load_state_dict(state_dict)
        self._clear_pending()
        if own is None:
            return
        saved = own["tensors"] if "tensors" in own else {n: {} for r in own["ranks"] for n in r}
        unknown = sorted(set(saved) - set(self._tensor_state))
        if unknown:
            raise ValueError(f"load_state_dict: compressor state for unknown parameters {unknown[:5]}")
        self._compression.load_state_dict(own["compressor"])
        by_name = {n: p for p, n in self._parameter_names.items()}
        if "ranks" in own:
            self._load_gathered(own, by_name)
            return
        world = own.get("world", self._world())
        if world != self._world() and any(has_per_rank(st) for st in saved.values()):
            raise ValueError(f"load_state_dict: this checkpoint holds one rank's compressor state "
                             f"(residuals, momenta) of a run at {world} ranks, and this run has "
                             f"{self._world()}; save it with state_dict(gather=True) to resume at "
                             "another world size, or drop its 'hvdcompress' entry to start the "
                             "compressor afresh")
        for name, st in saved.items():
            device = self._state_params(name, by_name)[0].device
            self._tensor_state[name] = {k: v.clone().to(device) if torch.is_tensor(v) else v
                                        for k, v in st.items()}

    def _load_gathered(self, own: dict, by_name: dict) -> None:
        """This rank's share of every rank's saved state (:mod:`hvdcompress.reshard`)."""
        for name in {n for r in own["ranks"] for n in r}:
            params = self._state_params(name, by_name)
            p, numel = params[0], sum(q.numel() for q in params)
            info = (lambda: bucket_info(self._buckets[name], [self._info(q) for q in params], _OPS)) \
                if name in self._buckets else (lambda: self._info(p))
            saved = [r.get(name, {}) for r in own["ranks"]]
            # in numpy (bfloat16, which numpy lacks, as float32), back to each entry's dtype after
            dtypes = {split_key(k)[2]: v.dtype for st in saved for k, v in st.items() if torch.is_tensor(v)}
            states = [{k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() if torch.is_tensor(v) else v
                       for k, v in st.items()} for st in saved]
            new = share_of_rank(states, numel, self._world(), self._rank(), self.op == hvd.Average,
                                own["average"], lambda: self._exchange.collective_for(
                                    info(), p.detach().reshape(-1)) == "alltoall", "load_state_dict")
            self._tensor_state[name] = {k: torch.from_numpy(v.copy()).to(p.device, dtypes[split_key(k)[2]])
                                        if isinstance(v, np.ndarray) else v for k, v in new.items()}

    def _state_params(self, name: str, by_name: dict) -> list:
        """The parameters whose state is kept under ``name``: one, or a fused bucket's."""
        bucket = self._buckets.get(name)
        return [by_name[m] for m in bucket.members] if bucket is not None else [by_name[name]]


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
