"""The replica-identity matrix (torch): train the same MLP on every rank's own batches with each
case of a product, and report a short digest of the parameters after every step, so the test
finds the first step (if any) at which two ranks' replicas differ.

argv[1]: JSON {"specs": [compression specs], "optimizers": [...], "clips": [...],
"modes": [...], "passes": [...], "steps": N, "collective": "auto", "horovod_fp16": bool}.
optimizers: "momentum" (SGD 0.9), "nesterov" (SGD 0.9 Nesterov), "adamw" (AdamW);
clips: null or a clip_grad_norm; modes: "step" (opt.step()) or "sync" (opt.synchronize() then
step() under skip_synchronize()); passes: backward_passes_per_step.
"horovod_fp16": also run Horovod's own DistributedOptimizer with its fp16 compression (and
with none), SGD, for ``steps`` steps (the baseline that README's fp16 caveat measures).
"""
import hashlib
import itertools
import json
import sys

import horovod.torch as hvd
import torch

import hvdcompress.torch as hvc
from common import result
from torch_common import batches, mlp

hvd.init()
torch.set_num_threads(1)
rank = hvd.rank()
cfg = json.loads(sys.argv[1])


def digest(model) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def optimizer(kind: str, model):
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=kind == "nesterov",
                           weight_decay=1e-4)


def run(opt, model, steps: int, passes: int, mode: str) -> list:
    digests = []
    data = batches(rank, steps * passes, seed=1)
    for _ in range(steps):
        opt.zero_grad()
        for _ in range(passes):
            x, y = next(data)
            torch.nn.functional.cross_entropy(model(x), y).backward()
        if mode == "sync":
            opt.synchronize()
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
        digests.append(digest(model))
    return digests


for spec, kind, clip, mode, passes in itertools.product(cfg["specs"], cfg["optimizers"], cfg["clips"],
                                                        cfg["modes"], cfg["passes"]):
    model = mlp()
    start = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
    opt = hvc.DistributedOptimizer(optimizer(kind, model), named_parameters=model.named_parameters(),
                                   compression=spec, clip_grad_norm=clip,
                                   backward_passes_per_step=passes,
                                   collective=cfg.get("collective", "auto"))
    digests = run(opt, model, cfg["steps"], passes, mode)
    end = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    result(rank, case=[spec, kind, clip, mode, passes], digests=digests,
           finite=bool(torch.isfinite(end).all()), moved=float((end - start).abs().max()))

if cfg.get("horovod_fp16"):
    for name, compression in (("none", hvd.Compression.none), ("fp16", hvd.Compression.fp16)):
        model = mlp()
        opt = hvd.DistributedOptimizer(optimizer("momentum", model), named_parameters=model.named_parameters(),
                                       compression=compression)
        result(rank, case=["horovod", name], digests=run(opt, model, cfg["steps"], 1, "step"))
