"""Memory decorators that wrap any compressor (BytePS style).

:class:`ErrorFeedback` (Seide et al. 2014; Karimireddy et al. 2019)::

    p = g + e;  c = C(p);  e = p - D(c)

Nothing is lost: over any number of steps, what was sent plus the residual equals the sum of the
gradients, so a biased compressor (top-k, sign) still converges. Costs one buffer of the
gradient's size and one local decompression per step: D(c) is decoded into the residual buffer
and ``e = p - D(c)`` formed in one fused pass (``Ops.sub_finite``), so besides p nothing is
allocated. Non-finite residual entries are reset to 0, so a single NaN step does not poison
every later one. Compressors with a cheaper fused residual keep their own (EFSignSGD, TwoBit,
PowerSGD) and refuse this wrapper.

:class:`Momentum` applies (Nesterov) momentum before compression, as BytePS does::

    m = mu * m + g;  send C(m)              (plain)
    m = mu * m + g;  send C(g + mu * m)     (nesterov)

The framework's own momentum must then be off for those tensors: the wrapper moves it here
(``takes_over_momentum``) and an explicit ``mu`` with a momentum optimizer is an error.
"""
from __future__ import annotations

import copy

from typing import Any, Optional

from ..ops.facade import Ops, Tensor
from .compressor import Compressor, Packet, TensorInfo
from .validation import check_bool, check_range


def check_inner(kind: type, inner: Any) -> Compressor:
    """``inner`` checked for a decorator of class ``kind``: a Compressor (TypeError) not wrapped
    in a ``kind`` already, at any depth (ValueError)."""
    owner = kind.__name__
    if not isinstance(inner, Compressor):
        raise TypeError(f"{owner} wraps a Compressor, got inner={inner!r}; allowed: an "
                        "hvdcompress Compressor, e.g. TopK(0.01)")
    layer = inner
    while isinstance(layer, Decorator):
        if type(layer) is kind:
            raise ValueError(f"{owner}: inner={inner!r} is wrapped in {owner} already; allowed: "
                             f"one {owner} per compressor")
        layer = layer.inner
    return inner


class Decorator(Compressor):
    """A compressor that wraps another and forwards what it does not change."""

    def __init__(self, inner: Compressor):
        self.inner = check_inner(type(self), inner)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    def unwrap(self) -> Compressor:
        return self.inner.unwrap()

    def wrapped(self) -> tuple:
        return (self.inner,)

    def config(self) -> dict:
        return {**self.arguments(), **self.inner.config()}

    def with_algorithm(self, algorithm: Compressor) -> Compressor:
        clone = copy.copy(self)
        clone.inner = self.inner.with_algorithm(algorithm)
        return clone

    @property
    def keeps_residual(self) -> bool:  # type: ignore[override]
        return self.inner.keeps_residual

    @property
    def supports_alltoall(self) -> bool:  # type: ignore[override]
        return self.inner.supports_alltoall

    @property
    def explicit_momentum(self) -> Optional[float]:
        return self.inner.explicit_momentum

    def server_side(self) -> Compressor:
        inner = self.inner.server_side()
        if inner is self.inner:
            return self
        if getattr(self, "_server", None) is None or self._server.inner is not inner:
            self._server = type(self)(inner)
        return self._server

    def init_state(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> None:
        self.inner.init_state(ops, x, state, info)

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        return self.inner.decompress(ops, tensors, ctx, info, out)

    def decompress_gathered(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                            world: int, out: Optional[Tensor] = None) -> Tensor:
        return self.inner.decompress_gathered(ops, tensors, ctx, info, world, out)

    def on_step(self) -> None:
        self.inner.on_step()

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)


class ErrorFeedback(Decorator):
    """Residual error feedback around ``inner``. State: ``residual``."""

    keeps_residual = True

    def init_state(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> None:
        super().init_state(ops, x, state, info)
        if "residual" not in state:
            ops.write(state, "residual", ops.zeros(info.numel, like=x))

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        p = x + state["residual"]  # a new tensor: the payload may be p itself
        packet = self.inner.compress(ops, p, state, info)
        residual = state["residual"]  # C(p) is decoded into the residual buffer, then e = p - C(p)
        decoded = self.inner.decompress(ops, packet.tensors, packet.ctx, info, out=residual)
        ops.write(state, "residual", ops.sub_finite(p, decoded, out=residual))
        return packet

    def arguments(self) -> dict:
        return {"ef": "vanilla"}


class Momentum(Decorator):
    """Momentum (plain or Nesterov) applied before ``inner``. State: ``momentum``.

    ``mu=None`` takes the wrapped optimizer's momentum for each tensor.
    """

    takes_over_momentum = True

    def server_side(self) -> Compressor:
        return self.inner.server_side()  # momentum is applied once, to the rank's own gradient

    def __init__(self, inner: Compressor, mu: Optional[float] = None, nesterov: bool = False):
        super().__init__(inner)
        self.mu = None if mu is None else check_range("Momentum", "mu", mu, 0.0, 1.0, high_open=True)
        self.nesterov = check_bool("Momentum", "nesterov", nesterov)

    @property
    def explicit_momentum(self) -> Optional[float]:
        return self.mu

    def init_state(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> None:
        super().init_state(ops, x, state, info)
        if "momentum" not in state:
            ops.write(state, "momentum", ops.zeros(info.numel, like=x))

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        mu = info.momentum if self.mu is None else self.mu
        nesterov = self.nesterov or info.nesterov
        if info.weight_decay and info.param is not None:
            x = x + info.param * info.weight_decay
        m = state["momentum"] * mu + x
        ops.write(state, "momentum", m)
        return self.inner.compress(ops, x + m * mu if nesterov else m, state, info)

    def arguments(self) -> dict:
        return {"momentum": "nesterov" if self.nesterov else "plain", "mu": self.mu}
