"""The flat exchange at many ranks (tests/test_scale16_horovod.py runs it at np=16): a tiny
model (Linear(16, 12), ReLU, Linear(12, 4): 256 parameters, biases smaller than the number of
ranks, so some segments of the compressed allreduce are all padding), 3 SGD steps on each
rank's own batches, once per compression in one launch (NoCompression: the dense reference).
Reports per compression the parameters after training, how far they moved from the broadcast
start, and the collective of each tensor."""
import time

import horovod.torch as hvd
import torch

import hvdcompress as hc
import hvdcompress.torch as hvc
from common import result
from torch_common import flat

STEPS = 3
COMPRESSIONS = {
    "dense": lambda: hc.NoCompression(),
    "dgc": lambda: hc.DGC(0.99, min_numel=0),
    "int8": lambda: hc.Int8(),
}

started = time.monotonic()
hvd.init()
torch.set_num_threads(1)


def model() -> torch.nn.Module:
    torch.manual_seed(1)  # the same start everywhere (broadcast as well)
    net = torch.nn.Sequential(torch.nn.Linear(16, 12), torch.nn.ReLU(), torch.nn.Linear(12, 4))
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    return net


records = {}
for name, make in COMPRESSIONS.items():
    net = model()
    start = flat(net).clone()
    opt = hvc.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.5),
                                   named_parameters=net.named_parameters(), compression=make())
    gen = torch.Generator().manual_seed(hvd.rank())
    for _ in range(STEPS):
        x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    records[name] = {"params": flat(net).tolist(), "moved": float((flat(net) - start).abs().max()),
                     "plan": {k: v[1] for k, v in opt._exchange.plan.items()}}
result(hvd.rank(), size=hvd.size(), seconds=time.monotonic() - started, **records)
