"""CSC through hvdcompress.torch.DistributedOptimizer under real Horovod.

A weight of 1000 elements (16 chunks of 64, the last of 40; two rounds: chunk norms, then the
chosen chunks) and a bias of 10 (below min_numel: dense, one round) in one group, SGD with
momentum 0.9 taken over by CSC, a two-step exponential warm-up. Each rank reports its final
parameters and bytes sent per step; the test recomputes them in numpy.
"""
import sys

import horovod.torch as hvd
import torch

import hvdcompress as hc
import hvdcompress.torch as hvc
from common import result
from torch_common import rank_vector

N, BIAS, CHUNK, RATIO, MIN_NUMEL, WARMUP, STEPS, LR, MU = 1000, 10, 64, 0.25, 100, 2, 4, 0.25, 0.9


class Toy(torch.nn.Module):
    """``loss = sum(w * c) + sum(b * d)``: the gradients are exactly ``c`` and ``d``."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(N))
        self.b = torch.nn.Parameter(torch.zeros(BIAS))

    def forward(self, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return (self.w * c).sum() + (self.b * d).sum()


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    model = Toy()
    csc = hc.CSC(RATIO, CHUNK, min_numel=MIN_NUMEL, warmup=hc.ExponentialWarmup(WARMUP, unit="step"))
    opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=MU),
                                   named_parameters=model.named_parameters(), compression=csc)
    sent = []
    for step in range(STEPS):
        opt.zero_grad()
        c = torch.from_numpy(rank_vector(hvd.rank(), N, seed=100 + 10 * step))
        d = torch.from_numpy(rank_vector(hvd.rank(), BIAS, seed=500 + 10 * step))
        model(c, d).backward()
        opt.step()
        sent.append(opt.last_step_bytes.sent)
    result(hvd.rank(), w=model.w.detach().tolist(), b=model.b.detach().tolist(), sent=sent,
           momentum_kept=opt.param_groups[0]["momentum"])


if __name__ == "__main__":
    sys.exit(main())
