"""A toy front end of the front-end contract (hvdcompress.step.frontend): a torch model's
parameters and their ``.grad`` on one simulated rank (tests/simulator.py), stepped by a torch
optimizer, with every take-over the real front ends offer (SGD's momentum, FrozenAdam), the
clip, fusion and two-level compression. The contract's sequence does the rest: this file is
only what is the toy's (under 150 lines, as the layout issue asks).

tests/test_ddp.py compares the DDP hook's launched ranks with it bit for bit on every DDP case,
and tests/test_frontend_contract.py runs it against the Horovod front end's numpy references.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from hvdcompress.adam.settings import adam_settings
from hvdcompress.engines.fusion import totals
from hvdcompress.engines.selection import select_engine
from hvdcompress.step.driver import Completion, StepDriver
from hvdcompress.step.frontend import FrontEnd
from hvdcompress.step.options import parse_options
from hvdcompress.torch.clipping import clip_gradients, clip_local_gradients
from hvdcompress.torch.fusion import bucket_tensors
from hvdcompress.torch.momentum_takeover import check_adam, check_momentum, suspended, takes_over
from hvdcompress.torch.tensors import OPS, adam_update, tensor_info


class ToyFrontEnd(FrontEnd):
    """``model``'s parameters trained by ``optimizer`` over ``comm`` (a simulated rank), the
    gradients compressed with ``compression``; ``take_over``: the compressor may take the
    optimizer's momentum or Adam step over; ``node_comms()``: the node and cross-node
    collectives of two-level compression (with ``intra_node``)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, compression: Any,
                 comm: Any, *, take_over: bool = True, clip_grad_norm: Optional[float] = None,
                 intra_node: Any = None, node_comms: Optional[Callable] = None, fusion: Optional[int] = None):
        options = parse_options(compression, op="average", average_op="average", sum_op="sum",
                                clip_grad_norm=clip_grad_norm, intra_node=intra_node, fusion=fusion)
        compressor = options.compressor
        self.opt, self.comm = optimizer, comm
        self.named = sorted((n, p) for n, p in model.named_parameters() if p.requires_grad)
        self.names = {p: n for n, p in self.named}
        self.momentum = take_over and takes_over(compressor, optimizer)
        if take_over:
            check_momentum(compressor, optimizer)
        adam = check_adam(compressor, optimizer) if take_over else None
        super().__init__(StepDriver(options, OPS, lambda: select_engine(
            compressor, OPS, comm, intra_node=options.intra_node, node_comms=node_comms),
            lambda: comm, "toy front end", adam=adam))
        self.group_of = {p: g for g in optimizer.param_groups for p in g["params"]}
        self.buckets = {b.name: b for b in options.buckets(bucket_tensors(self.named, optimizer.param_groups))}
        self.bucket_of = {m: b.name for b in self.buckets.values() for m in b.members}
        self.driver.completion = Completion({b.name: len(b.members) for b in self.buckets.values()})

    # ---- the framework's part of the contract -------------------------------------------------------
    def name(self, p: torch.Tensor) -> str:
        return self.names[p]

    def gradient(self, p: torch.Tensor) -> torch.Tensor:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        return p.grad.view(-1)

    def info(self, p: torch.Tensor):
        group = self.group_of[p] if self.momentum else None
        return tensor_info(p, self.names[p], self.comm.world, self.comm.rank, group)

    def settings(self, p: torch.Tensor):
        return adam_settings(self.group_of[p]) if self.driver.adam is not None else None

    def group(self, p: torch.Tensor) -> Optional[str]:
        return self.bucket_of.get(self.names[p])

    def out_of(self, entry: Any) -> Optional[torch.Tensor]:
        return entry.key.grad.view(-1) if isinstance(entry.key, torch.Tensor) else None

    def write(self, entry: Any) -> None:
        for p, total in totals(OPS, entry):
            if total is not None and self.out_of(entry) is None:
                p.grad.view(-1).copy_(total)

    def clip_local(self, params: list, scale: float) -> None:
        clip_local_gradients([self.gradient(p).view_as(p) for p in params], self.driver.options.clip_grad_norm,
                             self.comm.world, scale=scale)

    def clip_mean(self, params: list) -> Any:
        return clip_gradients([p.grad for p in params], self.driver.options.clip_grad_norm)

    # ---- a training step ----------------------------------------------------------------------------
    def step(self, named_gradients: Optional[dict] = None) -> None:
        """Exchange the gradients (``named_gradients``: name -> a flat gradient to train on in
        place of ``.grad``'s), then the optimizer's update, taken over or not."""
        if named_gradients is not None:
            for name, p in self.named:
                self.gradient(p).copy_(named_gradients[name])
        params = [p for _, p in self.named]
        self.driver.agree([(n, tuple(p.shape), str(p.dtype)) for n, p in self.named], torch.zeros(1))
        self.ready(params)
        skipped = self.wait()
        if self.driver.adam is not None:
            adam_update(self.driver.adam, self.opt.param_groups,
                        lambda p: self.driver.states.tensor(self.names[p]), self.names.get)
        else:
            with suspended(self.opt, self.momentum):
                self.opt.step()
        self.updated(skipped, named=lambda: [(n, p.detach()) for n, p in self.named])
