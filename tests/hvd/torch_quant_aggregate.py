"""One step on a linear model whose gradient is a known vector per rank, for the deterministic
quantisers: report p.grad after synchronize() (the test recomputes it in numpy)."""
import horovod.torch as hvd
import torch
from common import result
from torch_common import Linear, rank_vector

import hvdcompress as hc
import hvdcompress.torch as hvc

hvd.init()
torch.set_num_threads(1)
N = 1000
CASES = {
    "int8": hc.Int8(128),
    "onebit": hc.OneBit(),
    "signum": hc.Signum(),
    "twobit": hc.TwoBit(0.5),
    "threshold": hc.Threshold(1.0),
    "powersgd_dense_1d": hc.PowerSGD(),
}
for name, comp in CASES.items():
    model = Linear(N)
    opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=comp)
    opt.zero_grad()
    model(torch.from_numpy(rank_vector(hvd.rank(), N))).backward()
    opt.synchronize()
    result(hvd.rank(), case=name, grad=model.w.grad.tolist(), world=hvd.size(),
           kernels=hvc.TorchOps().uses_kernels)
