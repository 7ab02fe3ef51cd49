"""DGC at sparsity 0 with masking off against Horovod's own dense momentum SGD."""
import horovod.torch as hvd
import torch
from common import result
from torch_common import batches, flat, mlp

import hvdcompress as hc
import hvdcompress.torch as hvc

hvd.init()
torch.set_num_threads(1)
for nesterov in (False, True):
    for label, dgc in (("dense-path", hc.DGC(0.0, masking=False)),
                       ("sparse-path", hc.DGC(1e-12, masking=False, min_numel=0, sample_ratio=1.0))):
        trajectories = []
        for make in (lambda m: hvd.DistributedOptimizer(
                         torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=nesterov,
                                         weight_decay=1e-3), named_parameters=m.named_parameters()),
                     lambda m: hvc.DistributedOptimizer(
                         torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=nesterov,
                                         weight_decay=1e-3), named_parameters=m.named_parameters(),
                         compression=dgc)):
            model = mlp(seed=1)
            opt = make(model)
            points = []
            for x, y in batches(hvd.rank(), 12, seed=4):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                points.append(flat(model).clone())
            trajectories.append(torch.stack(points))
            sent = getattr(opt, "last_step_bytes", None)
        diff = float((trajectories[0] - trajectories[1]).abs().max())
        result(hvd.rank(), nesterov=nesterov, path=label, max_diff=diff,
               moved=float((trajectories[0][-1] - trajectories[0][0]).abs().max()),
               summable_sent=sent.sent)
