"""Train an MLP with each compressor given as JSON specs; report parameter checksums."""
import hashlib
import json
import sys

import horovod.torch as hvd
import torch
from common import result
from torch_common import flat, mlp, train

import hvdcompress
import hvdcompress.torch as hvc

hvd.init()
torch.set_num_threads(1)
for spec in json.loads(sys.argv[1]):
    model = mlp()
    start = flat(model).clone()
    opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=hvdcompress.from_params(spec))
    train(model, opt, hvd.rank(), steps=6)
    params = flat(model)
    result(hvd.rank(), spec=spec, params=hashlib.sha256(params.numpy().tobytes()).hexdigest(), moved=float((params - start).abs().max()),
           sent=opt.last_step_bytes.sent, dense=opt.last_step_bytes.dense,
           kernels=opt._exchange.ops.uses_kernels)
