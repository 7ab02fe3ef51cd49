"""What the DDP hook tests train, shared by the torchrun worker (tests/ddp/worker.py) and the
in-process reference (tests/test_ddp.py): a small model, each rank's batches, the compression
cases, and the reference itself, the Horovod front end's exchange per parameter on the
simulator of tests/simulator.py.

DDP puts every parameter in one bucket for the first iteration, records the order in which
gradients become ready, and then rebuilds its buckets in that order with ``bucket_cap_mb``:
here two buckets (head, then body; the model registers its layers in the opposite order to
their use). The hook's per-name state must survive that rebuild.

The reference is compared with the ranks bit for bit, so nothing in it may depend on where it
runs: a matmul's bits can change with the thread count (MKL, oneDNN), differently on each CPU
(issue 35: an AMD EPYC, head.weight off by up to 4e-6 after 4 steps). Hence (1) the ranks report
each step's local gradients, as DDP hands them to the hook (``encode``), and the reference
trains on those, after checking its own backward agrees with them to float rounding; (2) the
ranks and the reference's simulated ranks compute on ``THREADS`` torch threads each (the
compressors' own arithmetic: PowerSGD's matmuls, norms), the launchers' OMP_NUM_THREADS too.
"""
from __future__ import annotations

import base64
import threading
from functools import partial
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

import hvdcompress as hc

SEED = 3
BATCH = 16
BUCKET_CAP_MB = 0.001   # ~1 KB: after the rebuild, head and body in two buckets
#: torch threads of every rank (torch.set_num_threads, and OMP_NUM_THREADS of the launch: the
#: hook's callbacks run on Gloo's threads) and of every simulated rank of the reference
THREADS = 1


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(32, 10)   # registered first, used last
        self.body = torch.nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


_SEEDING = threading.Lock()   # the reference's simulated ranks are threads: one global RNG


def build_model() -> Net:
    with _SEEDING:
        torch.manual_seed(SEED)
        return Net()


def batch(rank: int, step: int) -> tuple:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, 64, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)


def sgd(params, momentum: float = 0.9, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=momentum, weight_decay=weight_decay)


class Case(NamedTuple):
    """``compression()`` a fresh compressor per rank; ``optimizer(params)``; whether the
    hook is given the optimizer (the momentum or Adam take-over); ``clip_grad_norm``; ``intra_node()``
    the node level's compressor of two-level compression over nodes of ``RANKS_PER_NODE``;
    ``halves``: the ranks split into two process groups, each training its own DDP model (a
    rank's batches are those of its rank in its group); ``check_replicas`` the hook's, and
    ``perturb_at``: the step before which rank 1 changes one of its parameters; ``fusion`` the
    bytes per fused bucket (:mod:`hvdcompress.engines.fusion`)."""

    compression: Callable[[], Optional[hc.Compressor]]
    optimizer: Callable = sgd
    take_over: bool = False
    clip_grad_norm: Optional[float] = None
    intra_node: Optional[Callable[[], hc.Compressor]] = None
    halves: bool = False
    check_replicas: Optional[int] = None
    perturb_at: Optional[int] = None
    fusion: Optional[int] = None


RANKS_PER_NODE = 2


CASES = {
    "none": Case(lambda: None),
    "fp16": Case(hc.FP16),
    "int8": Case(lambda: hc.Int8(chunk=256)),
    "onebit_ef": Case(lambda: hc.ErrorFeedback(hc.OneBit())),
    "topk_ef": Case(lambda: hc.ErrorFeedback(hc.TopK(0.05))),
    "dgc": Case(lambda: hc.DGC(0.95, min_numel=100),
                lambda params: sgd(params, weight_decay=1e-3), take_over=True),
    "powersgd": Case(lambda: hc.PowerSGD(rank=2)),
    "csc": Case(lambda: hc.CSC(0.1, chunk=64, min_numel=100), take_over=True),
    "momentum_nesterov": Case(lambda: hc.Momentum(hc.ErrorFeedback(hc.TopK(0.05))),
                              lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True,
                                                             weight_decay=1e-3),
                              take_over=True),
    "topk_ef_clip": Case(lambda: hc.ErrorFeedback(hc.TopK(0.05)), clip_grad_norm=0.5),
    "fp16_clip": Case(hc.FP16, clip_grad_norm=0.5),
    "frozen_adam": Case(lambda: hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=2),
                        lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01),
                        take_over=True, clip_grad_norm=0.5),
    "frozen_adam_momentum": Case(lambda: hc.FrozenAdam(hc.ErrorFeedback(hc.TopK(0.1)), freeze_steps=1,
                                                       send="momentum"),
                                 lambda params: torch.optim.Adam(params, lr=1e-2, weight_decay=1e-3),
                                 take_over=True),
    "halves_onebit_ef": Case(lambda: hc.ErrorFeedback(hc.OneBit()), halves=True),
    "replicas_checked": Case(lambda: hc.ErrorFeedback(hc.TopK(0.05)), check_replicas=1),
    "replicas_differ": Case(lambda: hc.ErrorFeedback(hc.TopK(0.05)), check_replicas=1, perturb_at=2),
    # one fused bucket of the whole model, across DDP's two buckets
    "fused_onebit_ef": Case(lambda: hc.ErrorFeedback(hc.OneBit()), fusion=1 << 20),
    "fused_dgc": Case(lambda: hc.DGC(0.95, min_numel=100), take_over=True, fusion=1 << 20),
    "fused_frozen_adam": Case(lambda: hc.FrozenAdam(hc.ErrorFeedback(hc.OneBit()), freeze_steps=2),
                              optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2), take_over=True,
                              fusion=1 << 20),
    "two_level_dgc": Case(lambda: hc.DGC(0.95, min_numel=100), take_over=True,
                          intra_node=hc.NoCompression),
}
#: every registered compressor with its defaults ("registry.<name>"): each must work through the hook
REGISTRY = {f"registry.{name}": Case(partial(hc.from_params, {"compressor": name})) for name in hc.available()}
CASES.update(REGISTRY)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, step: int) -> None:
    x, y = batch(rank, step)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def encode(tensor: torch.Tensor) -> str:
    """A float32 tensor's bits as text, for a JSON record (base64 of the raw bytes)."""
    return base64.b64encode(tensor.detach().to(torch.float32).contiguous().numpy().tobytes()).decode()


def decode(text: str) -> torch.Tensor:
    """:func:`encode`'s tensor, flat."""
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.float32)


def flat_params(model: torch.nn.Module) -> dict:
    """name -> the parameter's values as a list of floats (exact: float32 in a float64)."""
    return {n: p.detach().reshape(-1).tolist() for n, p in model.named_parameters()}


def reference(case: Case, comm, steps: int, node=None, cross=None,
              rank_grads: Optional[list] = None) -> dict:
    """One simulated rank (``comm``; ``node`` and ``cross`` its process sets for two-level
    compression) of the toy front end of the front-end contract (tests/toy_front_end.py) on this
    case: the step sequence every front end runs, over plain torch tensors. The rank's
    parameters after ``steps`` steps.

    ``rank_grads``: per step, parameter name -> the launched rank's local gradient (flat): trained
    on instead of this backward's own, which must agree with it to float rounding (the bits of
    a backward depend on the BLAS path and thread count, not the hook's)."""
    from toy_front_end import ToyFrontEnd  # tests/, which the launched workers do not import

    model = build_model()
    opt = case.optimizer(model.parameters())
    toy = ToyFrontEnd(model, opt, case.compression(), comm, take_over=case.take_over,
                      clip_grad_norm=case.clip_grad_norm, fusion=case.fusion,
                      intra_node=None if case.intra_node is None else case.intra_node(),
                      node_comms=lambda: (node, cross))
    for step in range(steps):
        x, y = batch(comm.rank, step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if rank_grads is not None:
            for name, p in model.named_parameters():
                fed = rank_grads[step][name].view_as(p)
                where = f"rank {comm.rank}, step {step}, {name}: the launched rank's gradient is not ours"
                torch.testing.assert_close(p.grad, fed, rtol=1e-4, atol=1e-5,
                                           msg=lambda m, w=where: f"{w}\n{m}")
                p.grad.copy_(fed)
        toy.step()
    return flat_params(model)
