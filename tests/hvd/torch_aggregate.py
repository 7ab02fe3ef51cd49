"""One step on a linear model whose gradient is a known vector per rank: report p.grad after
synchronize() for several compressors and reduction settings."""
import horovod.torch as hvd
import torch
from common import result
from torch_common import Linear, rank_vector

import hvdcompress as hc
import hvdcompress.torch as hvc

hvd.init()
N = 1000
CASES = {
    "topk50_avg": (hc.TopK(50), {}),
    "topk50_sum": (hc.TopK(50), {"op": hvd.Sum}),
    "topk50_predivide": (hc.TopK(50), {"gradient_predivide_factor": 2.0}),
    "dgc99_exact": (hc.DGC(0.99, sample_ratio=1.0, min_numel=0), {}),
    "fp16": (hc.FP16(), {}),
    "randomk": (hc.RandomK(100, seed=3), {}),
    "dense": (None, {}),
}
for name, (comp, kwargs) in CASES.items():
    model = Linear(N)
    opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), compression=comp, **kwargs)
    opt.zero_grad()
    model(torch.from_numpy(rank_vector(hvd.rank(), N))).backward()
    opt.synchronize()
    result(hvd.rank(), case=name, grad=model.w.grad.tolist(), world=hvd.size())
