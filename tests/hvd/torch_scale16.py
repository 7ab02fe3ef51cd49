"""Many ranks in one launch (tests/test_scale16_horovod.py runs it at np=16, as 4 nodes x 4 for
two-level; process sets registered at hvd.init with hvdcompress.torch.node_process_sets).

Flat: a tiny model (Linear(16, 12), ReLU, Linear(12, 4): 256 parameters, biases smaller than the
number of ranks, so some segments of the compressed allreduce are all padding), 3 SGD steps on
each rank's own batches, once per compression (NoCompression: the dense reference). Reports per
compression the parameters after training, how far they moved from the broadcast start, and the
collective of each tensor.

Two-level: NoCompression on both levels next to the flat allreduce (integer-valued gradients,
bit-exact), then FP16 inside + DGC across for a few steps.

Then, in the same processes (16 imports of torch take most of a launch here), the DDP
communication hook: tests/ddp/worker.py's cases named in argv[2] for argv[3] steps, over a
torch.distributed gloo group at 127.0.0.1:argv[1]; its records carry ``case``."""
import os
import sys
import time
from pathlib import Path

import horovod.torch as hvd
import torch
from common import result
from torch_common import flat, train_linear

import hvdcompress as hc
import hvdcompress.torch as hvc

STEPS, PER_NODE = 3, 4
COMPRESSIONS = {
    "dense": lambda: hc.NoCompression(),
    "dgc": lambda: hc.DGC(0.99, min_numel=0),
    "int8": lambda: hc.Int8(),
}

started = time.monotonic()
hvd.init(process_sets=hvc.node_process_sets(ranks_per_node=PER_NODE))
torch.set_num_threads(1)
rank = hvd.rank()


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
    gen = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    records[name] = {"params": flat(net).tolist(), "moved": float((flat(net) - start).abs().max()),
                     "plan": {k: v[1] for k, v in opt._exchange.plan.items()}}

exact, _ = train_linear(rank, 4096, 2, PER_NODE, True, intra_node=hc.NoCompression())
flat_w, _ = train_linear(rank, 4096, 2, PER_NODE, True)
dgc_w, dgc = train_linear(rank, 4096, 3, PER_NODE, compression=hc.DGC(0.99, min_numel=0),
                          intra_node=hc.FP16(), lr=0.1, momentum=0.9)
records["two_level"] = {"exact": exact.tolist(), "flat": flat_w.tolist(), "dgc_w": dgc_w.tolist(),
                        "inter_node": dgc.last_step_bytes.sent, "dense": dgc.last_step_bytes.dense}
result(rank, size=hvd.size(), seconds=time.monotonic() - started, **records)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ddp"))
import worker  # noqa: E402  (tests/ddp/worker.py)

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK=str(rank),
                  WORLD_SIZE=str(hvd.size()))
worker.run(sys.argv[2].split(","), int(sys.argv[3]), resume=[])
