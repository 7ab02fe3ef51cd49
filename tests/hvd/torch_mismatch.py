"""Ranks that disagree on parameters or compression get a clear error, not a hang: every case
in one launch (each construction is one agreement check; an error is raised on every rank)."""
import horovod.torch as hvd
import torch
from common import result

import hvdcompress as hc
import hvdcompress.torch as hvc

hvd.init()
for case in ("extra_param", "renamed", "compressor", "same"):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    named = list(model.named_parameters())
    comp = hc.TopK(2)
    if case == "extra_param" and hvd.rank() == 1:
        named.append(("extra", torch.nn.Parameter(torch.zeros(5))))
    if case == "renamed" and hvd.rank() == 1:
        named = [("x." + n, p) for n, p in named]
    if case == "compressor" and hvd.rank() == 1:
        comp = hc.TopK(3)
    params = [p for _, p in named]
    try:
        hvc.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), named_parameters=named, compression=comp)
        result(hvd.rank(), case=case, error=None)
    except ValueError as e:
        result(hvd.rank(), case=case, error=str(e))
