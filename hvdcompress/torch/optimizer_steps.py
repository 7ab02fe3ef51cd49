"""The Horovod torch optimizer's part of the front-end contract (:mod:`hvdcompress.step.frontend`).

Keys are the optimizer's parameters: a gradient is ``p.grad`` (zeros when None, densified with
``sparse_as_dense``), decoded into in place when it is dense and contiguous; a sparse gradient
without ``sparse_as_dense`` is sent apart, uncompressed, through Horovod's sparse allreduce;
the clips are Horovod's (:mod:`hvdcompress.torch.clipping`).
"""
from __future__ import annotations

import weakref
from typing import Any, Optional, Sequence

import horovod.torch as hvd
import torch

from ..adam.settings import AdamSettings, adam_settings
from ..contract.compressor import TensorInfo
from ..engines.fusion import totals
from ..step.frontend import FrontEnd
from .clipping import clip_gradients, clip_local_gradients
from .momentum_takeover import takes_over
from .tensors import OPS, tensor_info


class OptimizerSteps(FrontEnd):
    """The step sequence of :class:`hvdcompress.torch.DistributedOptimizer` ``opt``."""

    def __init__(self, opt: Any):
        super().__init__(opt._driver)
        self._opt = weakref.ref(opt)   # no cycle: a replaced optimizer is freed at once (its hooks go quiet)
        self.scaler = opt._scaler
        self.buckets = opt._buckets
        self._apart: dict = {}   # p -> Horovod's sparse allreduce handle

    @property
    def opt(self) -> Any:
        return self._opt()

    def name(self, p: torch.Tensor) -> str:
        return self.opt._parameter_names[p]

    def gradient(self, p: torch.Tensor) -> torch.Tensor:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        return (p.grad.to_dense() if p.grad.is_sparse else p.grad).reshape(-1)

    def info(self, p: torch.Tensor) -> TensorInfo:
        opt = self.opt
        group = opt._param_group[p] if takes_over(opt._compression, opt) else None
        return tensor_info(p, self.name(p), opt._comm.world, opt._comm.rank, group)

    def settings(self, p: torch.Tensor) -> Optional[AdamSettings]:
        return adam_settings(self.opt._param_group[p]) if self.driver.adam is not None else None

    def group(self, p: torch.Tensor) -> Any:
        return self.opt._group_of[p]

    def unscale(self, p: torch.Tensor) -> None:
        self.scaler.unscale(p)

    def sent_apart(self, p: torch.Tensor) -> bool:
        opt = self.opt
        if p.grad is None or not p.grad.is_sparse or opt.sparse_as_dense:
            return False
        if opt._compression.takes_over_momentum:
            raise ValueError(f"parameter '{self.name(p)}' has a sparse gradient, which "
                             f"{opt._compression.name} cannot compress; use sparse_as_dense=True")
        self._apart[p] = hvd.sparse_allreduce_async(p.grad, name=f"hvdc.sparse.{self.name(p)}",
                                                    op=opt.op, process_set=opt.process_set)
        return True

    def received(self) -> None:
        for p, finish in self._apart.items():
            p.grad = finish()  # Horovod's sparse allreduce hands back a function
        self._apart.clear()

    def forget(self) -> None:
        super().forget()
        self._apart.clear()

    def out_of(self, entry: Any) -> Optional[torch.Tensor]:
        """A dense contiguous gradient is the decoder's output buffer (no allocation); a fused
        bucket decodes into a buffer of its own, then cut into its gradients."""
        grad = getattr(entry.key, "grad", None)
        return None if grad is None or grad.is_sparse or not grad.is_contiguous() else grad.view(-1)

    def write(self, entry: Any) -> None:
        if self.out_of(entry) is not None:
            return   # decoded and scaled in p.grad already
        for p, total in totals(OPS, entry):
            if total is not None:
                grad = total.view(p.shape).to(p.dtype)
                p.grad = grad.to_sparse() if p.grad.is_sparse else p.grad.copy_(grad)

    def clip_local(self, params: Sequence[torch.Tensor], scale: float) -> None:
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        clip_local_gradients([p.grad for p in params], self.opt.clip_grad_norm, self.opt._comm.world,
                             average=self.opt.op == hvd.Average, scale=scale)

    def clip_mean(self, params: Sequence[torch.Tensor]) -> Any:
        return clip_gradients([p.grad for p in params if p.grad is not None], self.opt.clip_grad_norm)
