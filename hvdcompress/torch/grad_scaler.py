"""The torch optimizer's ``scaler=``: a ``torch.amp.GradScaler`` driven from inside the exchange,
the torch side of :mod:`hvdcompress.step.loss_scale` (unscale each gradient before compression, sum
the ranks' overflow flags, put the compressor state back on an overflow)."""
from __future__ import annotations

import sys
import warnings
from typing import Any, Optional

import torch
from torch.amp.grad_scaler import OptState

from ..ops.torch_ops import TorchOps
from ..step.clipping import what_it_keeps
from ..step.loss_scale import OverflowGuard
from ..transport.collectives import Collectives

_OPS = TorchOps()


def copy_into(value: torch.Tensor, buffer: Optional[torch.Tensor]) -> torch.Tensor:
    """A copy of ``value`` in ``buffer`` when it fits (no allocation), else a new one."""
    if buffer is not None and buffer.shape == value.shape and buffer.dtype == value.dtype \
            and buffer.device == value.device:
        return buffer.copy_(value)
    return value.detach().clone()


class GradScalerLink:
    """``scaler=``: the torch side of :mod:`hvdcompress.step.loss_scale` for one optimizer.

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
        if p.grad is not None:
            self.unscale_tensor(p.grad._values() if p.grad.is_sparse else p.grad)

    def unscale_tensor(self, grad: torch.Tensor) -> None:
        """Divide ``grad`` by the scale in place, raising this rank's flag on an inf/NaN."""
        if not self._inv:
            self._begin()
        if grad.device not in self._inv:
            self._inv[grad.device] = next(iter(self._inv.values())).to(grad.device)
            self._flags[grad.device] = torch.zeros((), dtype=torch.float32, device=grad.device)
        with torch.no_grad():
            torch._amp_foreach_non_finite_check_and_unscale_([grad], self._flags[grad.device],
                                                             self._inv[grad.device])

    def launch(self, comm: Collectives):
        """Start summing the ranks' overflow flags (after the gradients' collectives)."""
        if not self._inv:   # no gradient on this rank this step
            self._begin()
        device = self.scaler._scale.device
        flag = sum(f.to(device) for f in self._flags.values()).reshape(1)
        return self.guard.launch(comm, flag)

    def settle(self, comm: Collectives, handle) -> bool:
        """Whether any rank overflowed; if so the compressor state is as before the step. The
        scaler's ``found_inf`` for this optimizer is set to that answer."""
        overflow = self.guard.settle(comm, handle)
        device = self.scaler._scale.device
        found = torch.full((), float(overflow), dtype=torch.float32, device=device)
        self._opt_state()["found_inf_per_device"] = {device: found}
        self._inv, self._flags = {}, {}
        return overflow


def scaler_link(scaler: Any, optimizer: Optional[torch.optim.Optimizer]) -> Optional[GradScalerLink]:
    """A hook front end's ``scaler=`` (None: none) for the ``optimizer`` that ``scaler.step`` steps."""
    if scaler is None:
        return None
    if optimizer is None:
        raise ValueError(f"scaler={scaler!r} with optimizer=None: the scaler's skip of an overflow step "
                         "is kept per optimizer; pass optimizer=the optimizer that scaler.step(...) steps")
    return GradScalerLink(scaler, optimizer)


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


def enabled_scaler(scaler: Any) -> Any:
    """``scaler``, or None for a disabled ``GradScaler`` (``enabled=False`` scales nothing)."""
    return None if isinstance(scaler, torch.amp.GradScaler) and not scaler.is_enabled() else scaler


def warn_unscaled_amp(opt: Any) -> None:
    """Once per optimizer: ``step()`` runs inside ``GradScaler.step`` without ``scaler=`` while
    the compressor carries state, which then holds scaled gradients (hvdcompress.step.loss_scale)."""
    carrier = opt._watch.carrier
    if opt._scaler is not None or opt._amp_warned or carrier is None or not inside_grad_scaler():
        return
    opt._amp_warned = opt._watch.warned = True   # the watch's warning would be about unscale_
    warnings.warn(
        f"optimizer.step() runs inside torch.amp.GradScaler.step, but this hvdcompress "
        f"optimizer has no scaler=: {carrier.name}, which {what_it_keeps(carrier)}, then "
        "carries scaled gradients from step to step, so every change of the loss scale "
        "distorts its state (unscale_ after synchronize() divides only the current step) and "
        "an overflow step that the scaler skips still advances it. Pass scaler=<your "
        "GradScaler> to hvdcompress.torch.DistributedOptimizer (it unscales each gradient "
        "before compression and undoes overflow steps on every rank) and drop "
        "scaler.unscale_(optimizer); see docs/mixed_precision.md.", stacklevel=4)
