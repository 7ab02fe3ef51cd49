"""The replica-identity matrix (torch): train a model on every rank's own batches for each case,
and report a short digest of the parameters after every step, so the test finds the first step
(if any) at which two ranks' replicas differ.

argv[1]: JSON {"cases": [case...], "steps": N, "process_sets": [[ranks]...] (registered at
hvd.init), "ranks_per_node": L (register two-level's node sets instead), "horovod_fp16": bool,
"guard": bool}. A case: {"spec": compression, "optimizer": "momentum" | "nesterov" | "adamw" |
"sparse-sgd" (momentum, no weight decay: it takes no sparse gradient),
"clip": null or clip_grad_norm, "mode": "step" | "sync" (synchronize() then step() under
skip_synchronize()), "passes": backward_passes_per_step, and optionally "collective",
"model": "mlp" | "embedding" (a sparse nn.Embedding), "sparse_as_dense", "groups", "process_set": index
into process_sets, "intra_node": spec (two-level)}. Every case also runs the replica guard
(check_replicas=10), so a drift fails it by ReplicaMismatch as well as by its digests.
"horovod_fp16": also run Horovod's own DistributedOptimizer with its fp16 compression (and with
none), SGD with momentum (the baseline of README's fp16 note).
"guard": rank 1 changes one bit of one parameter after step 3, and every rank must raise
ReplicaMismatch at step 5 (check_replicas=5), then the same through HVDCOMPRESS_CHECK_REPLICAS.
"""
import hashlib
import json
import os
import sys

import horovod.torch as hvd
import torch
from common import result
from torch_common import batches, mlp

import hvdcompress.torch as hvc
from hvdcompress.step.replicas import ReplicaMismatch

cfg = json.loads(sys.argv[1])
if cfg.get("ranks_per_node"):
    SETS = hvc.node_process_sets(ranks_per_node=cfg["ranks_per_node"])
else:
    SETS = [hvd.ProcessSet(ranks) for ranks in cfg.get("process_sets", [])]
hvd.init(process_sets=SETS or None)
torch.set_num_threads(1)
rank = hvd.rank()


class Bag(torch.nn.Module):
    """A sparse embedding bag and a linear head: the embedding's gradient is sparse."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(200, 16, sparse=True)
        self.head = torch.nn.Linear(16, 10)
        hvd.broadcast_parameters(self.state_dict(), root_rank=0)

    def forward(self, x):
        return self.head(self.emb((x.abs() * 50).long().clamp(max=199)).mean(1))


def digest(model) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def optimizer(kind: str, model):
    if kind == "sparse-sgd":  # SGD's weight decay does not take sparse gradients
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=kind == "nesterov",
                           weight_decay=1e-4)


def run(opt, model, steps: int, passes: int = 1, mode: str = "step", after=None) -> list:
    digests = []
    data = batches(rank, steps * passes, seed=1)
    for step in range(1, steps + 1):
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
        if after is not None:
            after(step, model)
    return digests


for case in cfg.get("cases", []):
    model = Bag() if case.get("model") == "embedding" else mlp()
    start = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
    extra = {}
    if "process_set" in case:
        extra["process_set"] = SETS[case["process_set"]]
    if case.get("intra_node") is not None:
        extra.update(intra_node=case["intra_node"], ranks_per_node=cfg["ranks_per_node"])
    opt = hvc.DistributedOptimizer(optimizer(case["optimizer"], model),
                                   named_parameters=model.named_parameters(),
                                   compression=case["spec"], clip_grad_norm=case["clip"],
                                   backward_passes_per_step=case["passes"],
                                   collective=case.get("collective", "auto"),
                                   sparse_as_dense=case.get("sparse_as_dense", False),
                                   groups=case.get("groups"),
                                   check_replicas=10, **extra)
    digests = run(opt, model, cfg["steps"], case["passes"], case["mode"])
    end = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    members = SETS[case["process_set"]].ranks if "process_set" in case else list(range(hvd.size()))
    result(rank, case=case, digests=digests, members=members,
           finite=bool(torch.isfinite(end).all()), moved=float((end - start).abs().max()),
           sent=opt.total_bytes.sent, dense=opt.total_bytes.dense)

if cfg.get("horovod_fp16"):
    for name, compression in (("none", hvd.Compression.none), ("fp16", hvd.Compression.fp16)):
        model = mlp()
        opt = hvd.DistributedOptimizer(optimizer("momentum", model), named_parameters=model.named_parameters(),
                                       compression=compression)
        result(rank, case={"horovod": name}, digests=run(opt, model, cfg["steps"]))
    for name in ("fp16", "bf16"):
        model = mlp()
        opt = hvc.DistributedOptimizer(optimizer("momentum", model), named_parameters=model.named_parameters(),
                                       compression={"compressor": name})
        result(rank, case={"hvdcompress": name}, digests=run(opt, model, cfg["steps"]))


def flip_one_bit(step, model):
    """After step 3, rank 1's '2.bias'[3] gets its lowest mantissa bit flipped."""
    if step == 3 and rank == 1:
        with torch.no_grad():
            dict(model.named_parameters())["2.bias"].view(torch.int32)[3] ^= 1


if cfg.get("guard"):
    for how in ("argument", "environment"):
        model = mlp()
        if how == "environment":
            os.environ["HVDCOMPRESS_CHECK_REPLICAS"] = "5"
        opt = hvc.DistributedOptimizer(optimizer("momentum", model), named_parameters=model.named_parameters(),
                                       compression={"compressor": "dgc"},
                                       check_replicas=5 if how == "argument" else None)
        os.environ.pop("HVDCOMPRESS_CHECK_REPLICAS", None)
        try:
            run(opt, model, 8, after=flip_one_bit)
            error = None
        except ReplicaMismatch as e:
            error = str(e)
        result(rank, case={"guard": how}, error=error)
