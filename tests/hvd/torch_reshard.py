"""Checkpoints that resume at another world size (tests/test_reshard.py's Horovod part).

    torch_reshard.py DIR [--read TAG] [--write TAG]

For every case: with ``--read``, build the model and optimizer at this launch's world size and
load DIR/<case>.<TAG>.pt (written by a launch of another size); write each rank's compressor
state right after the load to DIR/<case>.<TAG>.loaded.rank<r>.npz, and check that one rank's
(not gathered) checkpoint of that run is refused here. Then train STEPS steps with the replica
guard on every step, and with ``--write`` save each rank's own state to
DIR/<case>.<TAG>.rank<r>.npz and the gathered checkpoint (``state_dict(gather=True)``, rank
0 writes it) to DIR/<case>.<TAG>.pt, with rank 0's own one in DIR/<case>.<TAG>.local.pt.
One record per case and rank: the collective each tensor took."""
import argparse

import horovod.torch as hvd
import numpy as np
import torch
from common import result

import hvdcompress
import hvdcompress.torch as hvc

CASES = {  # compressor, optimizer, keyword arguments of the wrapper
    "topk_ef_nesterov": (lambda: hvdcompress.from_params(
        {"compressor": "topk", "k": "0.05", "ef": "vanilla", "momentum": "nesterov"}), "sgd", {}),
    "dgc": (lambda: hvdcompress.DGC(0.9, min_numel=100), "sgd", {}),
    "onebit_ef_auto": (lambda: hvdcompress.ErrorFeedback(hvdcompress.OneBit()), "sgd", {}),
    "onebit_ef_alltoall": (lambda: hvdcompress.ErrorFeedback(hvdcompress.OneBit()), "sgd",
                           {"collective": "alltoall"}),
    "frozen_adam": (lambda: hvdcompress.FrozenAdam(hvdcompress.ErrorFeedback(hvdcompress.TopK(0.05)),
                                                   freeze_steps=2), "adam", {}),
    # fusion=: the model's four tensors in one bucket, whose residual is laid out as a tensor's
    "onebit_ef_fused": (lambda: hvdcompress.ErrorFeedback(hvdcompress.OneBit()), "sgd", {"fusion": True}),
}
STEPS = 4

parser = argparse.ArgumentParser()
parser.add_argument("dir")
parser.add_argument("--read")
parser.add_argument("--write")
args = parser.parse_args()
hvd.init()
torch.set_num_threads(1)
rank = hvd.rank()


def build(case: str):
    make, kind, options = CASES[case]
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(20, 50), torch.nn.ReLU(), torch.nn.Linear(50, 4))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    inner = (torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if kind == "sgd" else
             torch.optim.Adam(model.parameters(), lr=0.01))
    opt = hvc.DistributedOptimizer(inner, named_parameters=model.named_parameters(),
                                   compression=make(), check_replicas=1, **options)
    return model, opt


def save_own(opt, path: str) -> None:
    np.savez(path, **{f"{name}/{key}": v.numpy() for name, st in opt._tensor_state.items()
                      for key, v in st.items() if torch.is_tensor(v)})


def run(case: str) -> None:
    model, opt = build(case)
    if args.read:
        ckpt = torch.load(f"{args.dir}/{case}.{args.read}.pt", weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        save_own(opt, f"{args.dir}/{case}.{args.read}.loaded.rank{rank}.npz")
        try:
            opt.load_state_dict(torch.load(f"{args.dir}/{case}.{args.read}.local.pt", weights_only=False))
            refused = ""
        except ValueError as e:
            refused = str(e)
        opt.load_state_dict(ckpt["optimizer"])
    gen = torch.Generator().manual_seed(100 * hvd.size() + rank)
    for _ in range(STEPS):
        opt.zero_grad()
        x, y = torch.randn(8, 20, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    if args.write:
        save_own(opt, f"{args.dir}/{case}.{args.write}.rank{rank}.npz")
        gathered = opt.state_dict(gather=True)
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": gathered}, f"{args.dir}/{case}.{args.write}.pt")
            torch.save(opt.state_dict(), f"{args.dir}/{case}.{args.write}.local.pt")
    result(rank, case=case, world=hvd.size(), refused=refused if args.read else None,
           plan={name: row[1] for name, row in opt._exchange.plan.items()})


for name in CASES:
    run(name)
