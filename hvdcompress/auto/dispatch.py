"""The dispatching compressor under ``compression="auto"``: each tensor to the compressor picked
for it (:class:`hvdcompress.auto.compressor.Auto` makes the picks), each compressor's state under
its own prefix of the tensor's state, and the seconds spent in the compressors counted."""
from __future__ import annotations

import time
from collections.abc import MutableMapping
from typing import Any, Mapping, Optional

from ..contract.compressor import Compressor, Packet, TensorInfo
from ..ops.facade import Ops, Tensor
from ..state.prefixed import PrefixedState


class Dispatch(Compressor):
    """Each tensor to the compressor ``subs[choice[name]]``, its state under ``<label>/``.
    Segments and shards of a tensor (``name#seg0``, ``name#sum1``) go where the tensor goes.
    :attr:`codec_s`: the seconds spent in the compressors' compress and decode calls (the
    server side's included: ``clock`` is shared with it)."""

    name = "auto"

    def __init__(self, subs: Mapping[str, Compressor], choice: dict, clock: Optional[list] = None):
        self._subs, self._choice = dict(subs), choice
        self._clock = [0.0] if clock is None else clock

    @property
    def codec_s(self) -> float:
        return self._clock[0]

    def _timed(self, call: Any, *args: Any) -> Any:
        begin = time.perf_counter()
        try:
            return call(*args)
        finally:
            self._clock[0] += time.perf_counter() - begin

    @property
    def keeps_residual(self) -> bool:  # type: ignore[override]
        return any(sub.keeps_residual for sub in self._subs.values())

    @property
    def supports_alltoall(self) -> bool:  # type: ignore[override]
        return any(sub.supports_alltoall for sub in self._subs.values())

    @property
    def fusable(self) -> bool:  # type: ignore[override]
        return all(sub.unwrap().fusable for sub in self._subs.values())

    def _pick(self, info: TensorInfo, state: MutableMapping) -> tuple:
        """(the tensor's compressor, its state view)."""
        name = info.name if info.name in self._choice else info.name.rsplit("#", 1)[0]
        if name not in self._choice:
            raise RuntimeError(f"auto: no compressor picked for '{info.name}': Auto must be the "
                               "compression itself (not wrapped in another compressor) so that "
                               "the exchange asks it for each tensor's collective")
        label = self._choice[name]
        return self._subs[label], PrefixedState(state, f"{label}/")

    def init_state(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> None:
        sub, view = self._pick(info, state)
        sub.init_state(ops, x, view, info)

    def compress(self, ops: Ops, x: Tensor, state: dict, info: TensorInfo) -> Packet:
        sub, view = self._pick(info, state)
        return self._timed(sub.compress, ops, x, view, info)

    def decompress(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                   out: Optional[Tensor] = None) -> Tensor:
        return self._timed(self._pick(info, {})[0].decompress, ops, tensors, ctx, info, out)

    def decompress_gathered(self, ops: Ops, tensors: list, ctx: Any, info: TensorInfo,
                            world: int, out: Optional[Tensor] = None) -> Tensor:
        return self._timed(self._pick(info, {})[0].decompress_gathered, ops, tensors, ctx, info, world, out)

    def server_side(self) -> "Dispatch":
        return Dispatch({label: sub.server_side() for label, sub in self._subs.items()}, self._choice,
                        self._clock)

    def on_step(self) -> None:
        for sub in self._subs.values():
            sub.on_step()

    def set_epoch(self, epoch: int) -> None:
        for sub in self._subs.values():
            sub.set_epoch(epoch)

    def state_dict(self) -> dict:
        return {f"{label}/{key}": value for label, sub in self._subs.items()
                for key, value in sub.state_dict().items()}

    def load_state_dict(self, state: dict) -> None:
        for label, sub in self._subs.items():
            prefix = f"{label}/"
            sub.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
