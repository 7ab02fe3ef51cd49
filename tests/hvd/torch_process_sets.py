"""hvdcompress.torch.DistributedOptimizer restricted to process sets (Horovod's
test_optimizer_process_sets and a two-set variant). Ranks are split into the even set and the
odd set, registered the same way on every rank at hvd.init.

Case "one_set": every rank builds the optimizer with process_set=even_set: even ranks average
among themselves, odd ranks (outside the set) apply their own gradients with no collective.
Case "own_set": each rank uses its own set, so the two sets average separately.
Gradients are exact: loss = sum(w * c_r), so grad w = c_r (tests recompute it in numpy).
argv[1]: the compressions, comma-separated ("none", "fp16", "dgc"), each in turn."""
import sys

import horovod.torch as hvd
import torch
from common import result
from torch_common import Linear, rank_vector

import hvdcompress.torch as hvc

size = int(__import__("os").environ["HOROVOD_SIZE"])
even_set = hvd.ProcessSet([r for r in range(size) if r % 2 == 0])
odd_set = hvd.ProcessSet([r for r in range(size) if r % 2 == 1])
hvd.init(process_sets=[even_set, odd_set])
rank = hvd.rank()
N, STEPS = 64, 2
for name in sys.argv[1].split(","):
    spec = {"compressor": name}
    if name == "dgc":
        spec.update(sparsity="0.9", min_numel="0")
    for case in ("one_set", "own_set"):
        this_set = even_set if case == "one_set" or rank % 2 == 0 else odd_set
        model = Linear(N)
        opt = hvc.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                       named_parameters=model.named_parameters(), compression=spec,
                                       process_set=this_set)
        for step in range(STEPS):
            opt.zero_grad()
            model(torch.from_numpy(rank_vector(rank, N, seed=100 + 10 * step))).backward()
            opt.step()
        result(rank, spec=name, case=case, w=model.w.detach().tolist(), sent=opt.total_bytes.sent)

    # a global collective after each compression: ranks that skipped the optimizer's collectives
    # must still line up with the others (this is where the old constructor check hung)
    total = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum, name=f"after.{name}").item()
    result(rank, spec=name, case="after", total=total)
