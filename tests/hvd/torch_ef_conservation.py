"""Error feedback loses nothing: over T steps, sum of what was aggregated plus every rank's
residual equals the sum of every rank's gradients."""
import horovod.torch as hvd
import torch
from common import result
from torch_common import batches, mlp

import hvdcompress as hc
import hvdcompress.torch as hvc

hvd.init()
torch.set_num_threads(1)
model = mlp(seed=2)
opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters(),
                               compression=hc.ErrorFeedback(hc.TopK(0.02)), op=hvd.Sum)
names = dict((p, n) for n, p in model.named_parameters())
raw = {n: torch.zeros_like(p) for p, n in names.items()}
aggregated = {n: torch.zeros_like(p) for p, n in names.items()}
for x, y in batches(hvd.rank(), 8, seed=5):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for p, n in names.items():
        raw[n] += p.grad  # the hook has compressed it, p.grad still holds the local gradient
    opt.synchronize()
    for p, n in names.items():
        aggregated[n] += p.grad
    with opt.skip_synchronize():
        opt.step()
worst = 0.0
for p, n in names.items():
    residual = opt.state_dict()["hvdcompress"]["tensors"][n]["residual"].view_as(p)
    everyone_raw = hvd.allreduce(raw[n], op=hvd.Sum, name=f"raw.{n}")
    everyone_residual = hvd.allreduce(residual, op=hvd.Sum, name=f"res.{n}")
    worst = max(worst, float((aggregated[n] + everyone_residual - everyone_raw).abs().max()))
result(hvd.rank(), max_error=worst,
       residual_norm=float(sum(opt.state_dict()["hvdcompress"]["tensors"][n]["residual"].norm()
                               for n in raw)))
