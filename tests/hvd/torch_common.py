"""Shared pieces of the torch scripts run under horovodrun."""
import horovod.torch as hvd
import numpy as np
import torch


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
