"""Shared pieces of the torch scripts run under horovodrun."""
import sys
from pathlib import Path

import horovod.torch as hvd
import numpy as np
import torch

import hvdcompress.torch as hvc


def rank_vector(rank: int, n: int, seed: int = 100) -> np.ndarray:
    """The deterministic gradient rank ``rank`` produces (the tests recompute it in numpy)."""
    return np.random.default_rng(seed + rank).standard_normal(n).astype(np.float32)


class Linear(torch.nn.Module):
    """``loss = sum(w * c)``: the gradient of ``w`` is exactly ``c``."""

    def __init__(self, n: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(n))

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return (self.w * c).sum()


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU(), torch.nn.Linear(300, 10))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model


def batches(rank: int, steps: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    for _ in range(steps):
        yield torch.randn(16, 64, generator=gen), torch.randint(0, 10, (16,), generator=gen)


def train(model, opt, rank: int, steps: int, seed: int = 0):
    for x, y in batches(rank, steps, seed):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train_linear(rank: int, n: int, steps: int, per_node: int, integer: bool = False, **kwargs) -> tuple:
    """SGD from w = 0 on loss = sum(w * g) (so grad w = g exactly, g from
    tests/test_two_level.py's ``gradient``); ``(w, optimizer)``. With ``intra_node`` in
    ``kwargs``, two-level with ``per_node`` ranks per node."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_two_level import gradient  # tests/: the numpy reference's gradients
    w = torch.nn.Parameter(torch.zeros(n))
    sgd = torch.optim.SGD([w], lr=kwargs.pop("lr", 1.0), momentum=kwargs.pop("momentum", 0.0),
                          weight_decay=kwargs.pop("weight_decay", 0.0))
    opt = hvc.DistributedOptimizer(sgd, named_parameters=[("w", w)], ranks_per_node=per_node
                                   if kwargs.get("intra_node") is not None else None, **kwargs)
    for step in range(steps):
        opt.zero_grad()
        (w * torch.from_numpy(gradient(rank, n, 100 * step, integer))).sum().backward()
        opt.step()
    return w.detach().numpy().copy(), opt
