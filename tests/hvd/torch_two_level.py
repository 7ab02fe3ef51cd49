"""Two-level compression through hvdcompress.torch.DistributedOptimizer under horovodrun, 2 nodes
of 2 emulated on one machine with ranks_per_node; the process sets are registered at hvd.init with
hvdcompress.torch.node_process_sets. (16 ranks, 4 nodes x 4: tests/hvd/torch_scale16.py.)

argv[1] is a comma-separated list of parts, run in that order in one launch:
"reference": FP16 inside the node + ErrorFeedback(OneBit) across, SGD lr 1 from w = 0 on
loss = sum(w * g_r), so w = -(sum of the averaged updates): the test compares with
tests/test_two_level.py's numpy reference. Then NoCompression on both levels next to the flat
NoCompression optimizer on integer-valued gradients (bit-exact), and DGC with the SGD's momentum
and weight decay (the shard's state in the checkpoint).
"late" (last): the ranks of node 0 are slow (2 s before each node-local all-gather), so node 1
finishes its last step and exits while node 0's last all-gather is still to run; they report
before exiting, node 0 after its step (hvdcompress.transport.exit_guard keeps node 1's exit from shutting
Horovod down under node 0)."""
import sys
import time

import horovod.torch as hvd
import numpy as np
from common import result
from torch_common import train_linear

import hvdcompress as hc
import hvdcompress.torch as hvc

PER_NODE, PARTS = 2, sys.argv[1].split(",")
hvd.init(process_sets=hvc.node_process_sets(ranks_per_node=PER_NODE))
rank = hvd.rank()


def train(n: int, steps: int, integer: bool = False, **kwargs) -> tuple:
    return train_linear(rank, n, steps, PER_NODE, integer, **kwargs)


if "reference" in PARTS:
    w, opt = train(999, 3, compression=hc.ErrorFeedback(hc.OneBit()), intra_node=hc.FP16())
    exact, _ = train(1001, 2, True, intra_node=hc.NoCompression())
    flat, _ = train(1001, 2, True)
    dgc_w, dgc = train(3000, 3, compression=hc.DGC(0.99, min_numel=0), intra_node=hc.NoCompression(),
                       lr=0.1, momentum=0.9, weight_decay=1e-4)
    result(rank, part="reference", w=w.tolist(), exact=exact.tolist(), flat=flat.tolist(),
           inter_node=opt.last_step_bytes.sent, dense=opt.last_step_bytes.dense,
           dgc_w=float(np.abs(dgc_w).sum()), dgc_state=sorted(dgc.state_dict()["hvdcompress"]["tensors"]["w"]))
if "late" in PARTS:
    if rank < PER_NODE:
        slow = hvc.collectives.HorovodCollectives.allgather

        def allgather(self, tensors, tag):
            time.sleep(2.0)
            return slow(self, tensors, tag)
        hvc.collectives.HorovodCollectives.allgather = allgather
    w, _ = train(1001, 2, True, intra_node=hc.NoCompression())
    result(rank, part="late", w=w.tolist())
