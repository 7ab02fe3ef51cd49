"""Two-level compression through hvdcompress.torch.DistributedOptimizer under horovodrun, nodes
emulated on one machine with ranks_per_node (argv[1]); the process sets are registered at
hvd.init with hvdcompress.torch.node_process_sets.

argv[2] "reference" (2 nodes x 2): FP16 inside the node + ErrorFeedback(OneBit) across, SGD lr 1
from w = 0 on loss = sum(w * g_r), so w = -(sum of the averaged updates): the test compares
with tests/test_two_level.py's numpy reference. Then NoCompression on both levels next to the
flat NoCompression optimizer on integer-valued gradients (bit-exact), and DGC with the SGD's
momentum and weight decay (the shard's state in the checkpoint).
argv[2] "late" (2 nodes x 2): the ranks of node 0 are slow (2 s before each node-local
all-gather), so node 1 finishes its last step and exits while node 0's last all-gather is still
to run; they report before exiting, node 0 after its step (hvdcompress.exit_guard keeps node 1's
exit from shutting Horovod down under node 0).
argv[2] "scale" (e.g. 4 nodes x 4): a tiny model, NoCompression on both levels next to the flat
allreduce (integer-valued gradients, bit-exact), then FP16 + DGC for a few steps."""
import sys
import time
from pathlib import Path

import horovod.torch as hvd
import numpy as np
import torch

import hvdcompress as hc
import hvdcompress.torch as hvc
from common import result

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_two_level import gradient  # noqa: E402  (tests/: the numpy reference's gradients)

PER_NODE, MODE = int(sys.argv[1]), sys.argv[2]
hvd.init(process_sets=hvc.node_process_sets(ranks_per_node=PER_NODE))
rank = hvd.rank()


def train(n: int, steps: int, integer: bool = False, **kwargs) -> tuple:
    """SGD from w = 0 on loss = sum(w * g) (so grad w = g exactly); (w, optimizer)."""
    w = torch.nn.Parameter(torch.zeros(n))
    sgd = torch.optim.SGD([w], lr=kwargs.pop("lr", 1.0), momentum=kwargs.pop("momentum", 0.0),
                          weight_decay=kwargs.pop("weight_decay", 0.0))
    opt = hvc.DistributedOptimizer(sgd, named_parameters=[("w", w)], ranks_per_node=PER_NODE
                                   if kwargs.get("intra_node") is not None else None, **kwargs)
    for step in range(steps):
        opt.zero_grad()
        (w * torch.from_numpy(gradient(rank, n, 100 * step, integer))).sum().backward()
        opt.step()
    return w.detach().numpy().copy(), opt


if MODE == "reference":
    w, opt = train(999, 3, compression=hc.ErrorFeedback(hc.OneBit()), intra_node=hc.FP16())
    exact, _ = train(1001, 2, True, intra_node=hc.NoCompression())
    flat, _ = train(1001, 2, True)
    dgc_w, dgc = train(3000, 3, compression=hc.DGC(0.99, min_numel=0), intra_node=hc.NoCompression(),
                       lr=0.1, momentum=0.9, weight_decay=1e-4)
    result(rank, w=w.tolist(), exact=exact.tolist(), flat=flat.tolist(),
           inter_node=opt.last_step_bytes.sent, dense=opt.last_step_bytes.dense,
           dgc_w=float(np.abs(dgc_w).sum()), dgc_state=sorted(dgc.state_dict()["hvdcompress"]["tensors"]["w"]))
elif MODE == "late":
    if rank < PER_NODE:
        slow = hvc.collectives.HorovodCollectives.allgather

        def allgather(self, tensors, tag):
            time.sleep(2.0)
            return slow(self, tensors, tag)
        hvc.collectives.HorovodCollectives.allgather = allgather
    w, _ = train(1001, 2, True, intra_node=hc.NoCompression())
    result(rank, w=w.tolist())
else:
    exact, _ = train(4096, 2, True, intra_node=hc.NoCompression())
    flat, _ = train(4096, 2, True)
    dgc_w, dgc = train(4096, 3, compression=hc.DGC(0.99, min_numel=0), intra_node=hc.FP16(),
                       lr=0.1, momentum=0.9)
    result(rank, exact=exact.tolist(), flat=flat.tolist(), dgc_w=dgc_w.tolist(),
           inter_node=dgc.last_step_bytes.sent, dense=dgc.last_step_bytes.dense)
