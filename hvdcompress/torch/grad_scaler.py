"""The torch optimizer's ``scaler=``: a ``torch.amp.GradScaler`` driven from inside the exchange,
the torch side of :mod:`hvdcompress.loss_scale` (unscale each gradient before compression, sum
the ranks' overflow flags, put the compressor state back on an overflow)."""
from __future__ import annotations

import sys
from typing import Optional

import torch
from torch.amp.grad_scaler import OptState

from ..loss_scale import OverflowGuard
from .backend import TorchOps
from .collectives import HorovodCollectives

_OPS = TorchOps()


def copy_into(value: torch.Tensor, buffer: Optional[torch.Tensor]) -> torch.Tensor:
    """A copy of ``value`` in ``buffer`` when it fits (no allocation), else a new one."""
    if buffer is not None and buffer.shape == value.shape and buffer.dtype == value.dtype \
            and buffer.device == value.device:
        return buffer.copy_(value)
    return value.detach().clone()


class GradScalerLink:
    """``scaler=``: the torch side of :mod:`hvdcompress.loss_scale` for one optimizer.

    At the step's first gradient it reads the GradScaler's scale tensor (``_scale``: no host
    sync) as 1/s in float32, computed in float64 as ``GradScaler.unscale_`` does, and records in
    the scaler that this optimizer's gradients are unscaled (stage ``UNSCALED``), so that its
    ``step`` does not unscale them again. Each gradient is unscaled in place by the scaler's own
    kernel (``torch._amp_foreach_non_finite_check_and_unscale_``), which raises this rank's
    overflow flag on an inf/NaN. After the exchange the flag summed over ranks becomes the
    scaler's ``found_inf`` of this optimizer: ``step`` is skipped and ``update`` lowers the
    scale identically on every rank.
    """

    def __init__(self, scaler, optimizer: torch.optim.Optimizer):
        self.scaler = scaler
        self.key = id(optimizer)   # the scaler's key (_per_optimizer_states); no reference cycle
        self.guard = OverflowGuard(_OPS, copy_into)
        self._inv: dict = {}       # device -> 1/s of this step
        self._flags: dict = {}     # device -> this rank's overflow flag of this step

    def _opt_state(self) -> dict:
        return self.scaler._per_optimizer_states[self.key]

    def _begin(self) -> None:
        scale = self.scaler._scale
        if scale is None:
            raise RuntimeError("scaler=: gradients arrived, but the GradScaler has no scale yet; "
                               "run the backward pass on scaler.scale(loss)")
        state = self._opt_state()
        if state["stage"] is not OptState.READY:
            raise RuntimeError(f"scaler=: the GradScaler's stage for this optimizer is {state['stage'].name} "
                               "at its first gradient: scaler.unscale_(optimizer) or scaler.step(optimizer) "
                               "ran before the backward pass finished. With scaler= the optimizer "
                               "unscales the gradients itself: drop scaler.unscale_(optimizer) and call "
                               "scaler.step(optimizer) after the backward pass")
        self._inv[scale.device] = scale.double().reciprocal().float()
        self._flags[scale.device] = torch.zeros((), dtype=torch.float32, device=scale.device)
        state["stage"] = OptState.UNSCALED
        state["found_inf_per_device"] = self._flags   # this rank's until settle()

    def unscale(self, p: torch.Tensor) -> None:
        """Divide ``p.grad`` by the scale in place (a sparse one's values), before compression."""
        if p.grad is None:
            return
        if not self._inv:
            self._begin()
        grad = p.grad._values() if p.grad.is_sparse else p.grad
        if grad.device not in self._inv:
            self._inv[grad.device] = next(iter(self._inv.values())).to(grad.device)
            self._flags[grad.device] = torch.zeros((), dtype=torch.float32, device=grad.device)
        with torch.no_grad():
            torch._amp_foreach_non_finite_check_and_unscale_([grad], self._flags[grad.device],
                                                             self._inv[grad.device])

    def launch(self, comm: HorovodCollectives):
        """Start summing the ranks' overflow flags (after the gradients' collectives)."""
        if not self._inv:   # no gradient on this rank this step
            self._begin()
        device = self.scaler._scale.device
        flag = sum(f.to(device) for f in self._flags.values()).reshape(1)
        return self.guard.launch(comm, flag)

    def settle(self, comm: HorovodCollectives, handle) -> bool:
        """Whether any rank overflowed; if so the compressor state is as before the step. The
        scaler's ``found_inf`` for this optimizer is set to that answer."""
        overflow = self.guard.settle(comm, handle)
        device = self.scaler._scale.device
        found = torch.full((), float(overflow), dtype=torch.float32, device=device)
        self._opt_state()["found_inf_per_device"] = {device: found}
        self._inv, self._flags = {}, {}
        return overflow


def inside_grad_scaler() -> bool:
    """Whether the running ``step()`` was called by an enabled ``torch.amp.GradScaler``: one of
    the few frames above it is a GradScaler method (Optimizer's profiling wrapper sits between)."""
    frame = sys._getframe(1)
    for _ in range(6):
        if frame is None:
            return False
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.amp.GradScaler) and owner.is_enabled():
            return True
        frame = frame.f_back
    return False
