"""CSC through hvdcompress.torch.DistributedOptimizer under real Horovod.

argv[1]: a JSON list of configs (n, bias, chunk, ratio, min_numel, warmup, steps, lr, mu,
nesterov), each run in turn and reported with its index as ``run``. A
weight of ``n`` elements (compressed: two rounds, chunk norms then the chosen chunks) and a bias
of ``bias`` elements (below min_numel: dense, one round) in one group; torch SGD's momentum is
taken over by CSC; an exponential warm-up over ``warmup`` steps. Each rank reports its final
parameters and bytes sent per step; the test recomputes them in numpy.
"""
import json
import sys

import horovod.torch as hvd
import torch
from common import result
from torch_common import rank_vector

import hvdcompress as hc
import hvdcompress.torch as hvc


class Toy(torch.nn.Module):
    """``loss = sum(w * c) + sum(b * d)``: the gradients are exactly ``c`` and ``d``."""

    def __init__(self, n: int, bias: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(n))
        self.b = torch.nn.Parameter(torch.zeros(bias))

    def forward(self, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return (self.w * c).sum() + (self.b * d).sum()


def train(run: int, cfg: dict) -> None:
    model = Toy(cfg["n"], cfg["bias"])
    csc = hc.CSC(cfg["ratio"], cfg["chunk"], min_numel=cfg["min_numel"],
                 warmup=hc.ExponentialWarmup(cfg["warmup"], unit="step"))
    sgd = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["mu"], nesterov=cfg["nesterov"])
    opt = hvc.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), compression=csc)
    sent = []
    for step in range(cfg["steps"]):
        opt.zero_grad()
        c = torch.from_numpy(rank_vector(hvd.rank(), cfg["n"], seed=100 + 10 * step))
        d = torch.from_numpy(rank_vector(hvd.rank(), cfg["bias"], seed=500 + 10 * step))
        model(c, d).backward()
        opt.step()
        sent.append(opt.last_step_bytes.sent)
    result(hvd.rank(), run=run, w=model.w.detach().tolist(), b=model.b.detach().tolist(), sent=sent,
           momentum_kept=opt.param_groups[0]["momentum"])


hvd.init()
torch.set_num_threads(1)
for i, config in enumerate(json.loads(sys.argv[1])):
    train(i, config)
