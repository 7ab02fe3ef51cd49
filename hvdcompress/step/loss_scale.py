"""Mixed precision with a loss scaler: compressor state in unscaled units, overflow steps undone.

With a loss scaler (``torch.amp.GradScaler``, Keras's ``LossScaleOptimizer``) the backward pass
of step t yields ``s_t · g_t``, ``s_t`` the scale of that step. A compressor that carries state
from step to step (an error-feedback residual, DGC's momentum and velocity, PowerSGD's residual,
the ``Momentum`` decorator's momentum, FrozenAdam's m) adds this step's input to what it kept::

    e_{t+1} = (s_t g_t + e_t) − C(s_t g_t + e_t)

so the state is in the units of the scales it was built under. Unscaling only the exchanged
result by ``1/s_t`` (Horovod's AMP pattern: ``synchronize()``, then ``scaler.unscale_``) divides
what was carried over from earlier steps by the wrong factor: each change of scale (×2 after
every ``growth_interval`` finite steps, ×½ after an overflow) distorts all carried state by that
factor. Measured at 2 ranks, 30 steps, the scale doubling every 3 steps: the weights end 19%
(PowerSGD) to 79% (top-k + error feedback) of the distance training moved them away from the
run without a scaler (tests/test_amp.py).

The wrappers with a scaler (``scaler=``) therefore unscale each gradient *before* it is
compressed, ``x_t = (s_t g_t) · (1/s_t)``, so every state lives in unscaled units and the
result does not depend on the scale: bit for bit when ``s_t`` is a power of two (GradScaler's
default init 2^16, growth ×2, back-off ×½: multiplying by 2^-k is exact unless the result is
subnormal), within float rounding otherwise.

A step that overflows (some rank's ``s_t g_t`` holds an inf or NaN) is skipped by the scaler,
which lowers the scale; the compressor must not advance either, on any rank. Compression starts
in the backward pass, before a rank can know that another rank overflowed, so
:class:`OverflowGuard` keeps a copy of each tensor's state from just before its compression
(:meth:`OverflowGuard.save`), the ranks sum their overflow flags (one allreduce of one number,
launched after the gradients' collectives), and on an overflow every rank puts the copies back
(:meth:`OverflowGuard.settle`): the state is then exactly what it was before the step, keys the
step created included (they are removed). The compressor-wide counters (``on_step``) advance in
the wrapper's step, which the overflow skips.

A front end that holds every gradient of the step before it compresses the first (TensorFlow's
tape and Keras optimizer: the exchange runs once all gradients exist) asks first instead
(:func:`any_overflow`: the same one allreduce of one number, before the exchange) and does not
compress an overflow step at all: the state is untouched, with no copy to keep or put back.

The price, with a scaler only: one copy of every tensor's compressor state per step (a memcpy
of its size, into buffers kept from step to step: the state's memory once more), one allreduce
of one number per step (latency only), and one host read of the summed flag per step (the
scaler's own step reads its flag too). The alternative, rescaling the state whenever the scale
changes, costs no copy, but cannot undo what an overflow step did to a state (a top-k residual
has lost the entries it sent; PowerSGD's orthogonalised factors are not linear in the input).
"""
from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Callable, Optional

from ..ops.facade import Ops, Tensor
from ..transport.collectives import Collectives

#: the name of the collective that sums the ranks' overflow flags
OVERFLOW_TAG = "hvdc.loss_scale.overflow"

#: state values that are Python values (a step counter), kept as they are; anything else is a tensor
_VALUES = (bool, int, float, str, type(None))


class OverflowGuard:
    """Undo a step's changes to the compressor state when any rank's gradients overflowed.

    ``copy(value, buffer)``: a copy of the tensor ``value`` that later writes to ``value`` do not
    change, written into ``buffer`` (the previous step's copy of the same entry, or None) where
    the framework can (torch: ``buffer.copy_(value)``), else a new one (TensorFlow: a read of
    the variable). One step::

        guard.save(name, state)          # for every tensor, before its compression
        handle = guard.launch(comm, flag)   # this rank's flag (1: inf/NaN seen), after the exchange's launches
        overflow = guard.settle(comm, handle)   # True on every rank if any rank overflowed; state restored
    """

    def __init__(self, ops: Ops, copy: Callable[[Tensor, Optional[Tensor]], Tensor]):
        self.ops = ops
        self.copy = copy
        self._saved: dict = {}     # tensor name -> (its state, {key: its value before the step})
        self._buffers: dict = {}   # tensor name -> {key: copy buffer}, reused from step to step

    def save(self, name: str, state: MutableMapping) -> None:
        """Keep ``state`` (tensor ``name``'s) as it is now, before this step changes it; a
        tensor saved twice in one step keeps its first copy."""
        if name in self._saved:
            return
        buffers = self._buffers.setdefault(name, {})
        kept = {}
        for key in list(state):
            value = state[key]
            if isinstance(value, _VALUES):
                kept[key] = value
            else:
                kept[key] = buffers[key] = self.copy(value, buffers.get(key))
        self._saved[name] = (state, kept)

    def launch(self, comm: Collectives, flag: Tensor) -> Any:
        """Start the sum over ranks of the overflow flags (``flag``: a 1-element float tensor,
        > 0 where this rank saw an inf or NaN)."""
        return comm.allreduce([flag], OVERFLOW_TAG)

    def settle(self, comm: Collectives, handle: Any) -> bool:
        """Whether any rank overflowed (the same answer on every rank); if so, every saved state
        is put back as it was. Forgets the step's copies either way (the buffers stay)."""
        overflow = self.ops.scalar(comm.wait(handle)[0]) > 0
        if overflow:
            self.restore()
        self._saved.clear()
        return overflow

    def restore(self) -> None:
        """Put every state saved this step back as it was: keys added since are removed, Python
        values reset, tensors written back in place (:meth:`Ops.write`)."""
        for name, (state, kept) in self._saved.items():
            for key in [k for k in state if k not in kept]:
                del state[key]
            for key, value in kept.items():
                if isinstance(value, _VALUES):
                    state[key] = value
                else:
                    self.ops.write(state, key, value)
            # a write that could not reuse the state's buffer stored the copy itself: copy afresh next time
            self._buffers.pop(name, None)


def any_overflow(ops: Ops, comm: Collectives, flag: Tensor) -> bool:
    """Whether any rank saw an inf or NaN this step: the same answer on every rank, from the sum
    over ranks of ``flag`` (a 1-element float tensor, > 0 where this rank saw one; one allreduce
    of one number). For front ends that know every gradient before compressing the first
    (TensorFlow's): asked before the exchange, it lets them skip an overflow step's compression
    on every rank, so the compressor state is untouched (see the module doc)."""
    return ops.scalar(comm.wait(comm.allreduce([flag], OVERFLOW_TAG))[0]) > 0
